// Migrations are listed, not globbed: the list is type-checked and works the same from src and dist.
import { Orders1764414000000 } from './1764414000000-orders.js';

export const migrations = [Orders1764414000000];
