import { type CanActivate, type ExecutionContext, Injectable, UnauthorizedException } from '@nestjs/common';

/** Stands in for the app's authentication: every route needs a caller, and every query is scoped to it. */
@Injectable()
export class ClientGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const clientId = context.switchToHttp().getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers['x-client-id'];
    if (typeof clientId !== 'string' || clientId === '') throw new UnauthorizedException('Send X-Client-Id.');
    return true;
  }
}
