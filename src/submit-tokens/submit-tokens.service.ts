import { Inject, Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { Database } from '@idempotent-orders/idempotency';
import type { CreatedOrder } from '../orders/orders.service.js';
import { submitTokenInvalid, submitTokenUsed } from './submit-token-problems.js';
import { type ProblemException } from '#service-kit';

export const SUBMIT_TOKEN_HEADER = 'Submit-Token';

/** What issueSubmitToken makes: 32 bytes in unpadded base64url. Anything else cannot be a token, and needs no query to say so. */
const TOKEN_SHAPE = /^[A-Za-z0-9_-]{43}$/;

export interface IssuedSubmitToken {
  token: string;
  expiresAt: string;
}

/**
 * The claim: one conditional UPDATE, never check-then-update. A concurrent submit of the same
 * token waits on this row's lock, then re-evaluates the WHERE against the committed row and
 * matches nothing. Unknown, expired, another client's and already used all match nothing too.
 */
const CONSUME_SUBMIT_TOKEN = `
  UPDATE submit_tokens SET consumed_at = now()
   WHERE token = $1 AND client_id = $2 AND consumed_at IS NULL AND expires_at > now()
  RETURNING token`;

const REAP_EXPIRED_SUBMIT_TOKENS = `
  DELETE FROM submit_tokens WHERE token IN (
    SELECT token FROM submit_tokens
     WHERE expires_at < now() - interval '1 day'
     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
  RETURNING token`;

@Injectable()
export class SubmitTokensService {
  constructor(
    private readonly db: Database,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  async issueSubmitToken(clientId: string): Promise<IssuedSubmitToken> {
    const token = randomBytes(32).toString('base64url');
    const [row] = await this.db.query<{ token: string; expires_at: Date }>(
      `INSERT INTO submit_tokens (token, client_id, expires_at) VALUES ($1, $2, now() + make_interval(secs => $3))
       RETURNING token, expires_at`,
      [token, clientId, this.config.submitTokenTtlSeconds],
    );
    return { token: row.token, expiresAt: row.expires_at.toISOString() };
  }

  /**
   * Runs `createOrder` at most once per token (docs/contract.md#orders): in ONE transaction the token is
   * consumed, the order created and recorded on the token. Any error rolls all three back, so a
   * failed attempt leaves the token as it was.
   */
  consumeSubmitToken(clientId: string, token: string, createOrder: () => Promise<CreatedOrder>): Promise<CreatedOrder> {
    if (!TOKEN_SHAPE.test(token)) return Promise.reject(submitTokenInvalid());
    return this.db.transaction(async () => {
      const [consumed] = await this.db.query<{ token: string }>(CONSUME_SUBMIT_TOKEN, [token, clientId]);
      if (!consumed) throw await this.refusal(clientId, token);
      const result = await createOrder();
      await this.db.query(`UPDATE submit_tokens SET order_id = $2 WHERE token = $1`, [token, result.order.id]);
      return result;
    });
  }

  /** Why the UPDATE matched nothing. Read after it, so a consumer it waited for has committed and is seen. */
  private async refusal(clientId: string, token: string): Promise<ProblemException> {
    const [row] = await this.db.query<{ consumed_at: Date | null; order_id: string | null }>(
      `SELECT consumed_at, order_id FROM submit_tokens WHERE token = $1 AND client_id = $2`,
      [token, clientId],
    );
    return row?.consumed_at ? submitTokenUsed(row.order_id) : submitTokenInvalid();
  }

  /** Deletes up to `batchSize` tokens that expired more than a day ago; returns how many. */
  async reapExpiredSubmitTokens(batchSize: number): Promise<number> {
    const rows = await this.db.query<{ token: string }>(REAP_EXPIRED_SUBMIT_TOKENS, [batchSize]);
    return rows.length;
  }
}
