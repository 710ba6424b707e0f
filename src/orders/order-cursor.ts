import { isUUID } from 'class-validator';
import { ProblemException } from '#service-kit';

/** A position in the (created_at DESC, id DESC) order. created_at is kept as PostgreSQL's text, to the microsecond. */
export interface OrderCursor {
  createdAt: string;
  id: string;
}

export function encodeCursor(cursor: OrderCursor): string {
  return Buffer.from(JSON.stringify([cursor.createdAt, cursor.id])).toString('base64url');
}

export function decodeCursor(raw: string): OrderCursor {
  try {
    const value: unknown = JSON.parse(Buffer.from(raw, 'base64url').toString('utf8'));
    if (
      Array.isArray(value) &&
      value.length === 2 &&
      typeof value[0] === 'string' &&
      /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?[+-]\d{2}(:\d{2})?$/.test(value[0]) &&
      // The shape alone lets "2024-13-45 99:99:99" through to PostgreSQL; the date must exist too.
      !Number.isNaN(Date.parse(value[0].replace(' ', 'T').replace(/([+-]\d{2})$/, '$1:00'))) &&
      typeof value[1] === 'string' &&
      isUUID(value[1])
    ) {
      return { createdAt: value[0], id: value[1] };
    }
  } catch {
    // fall through: any undecodable cursor is the client's mistake
  }
  throw ProblemException.of(400, 'invalid-cursor', 'Invalid cursor', 'cursor must be the nextCursor of a previous page, unchanged.');
}
