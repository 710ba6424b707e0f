import { Logger } from '@nestjs/common';
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import type { StoredResponse } from './idempotency-keys.service.js';
import { PROBLEM_CONTENT_TYPE, ProblemDetailsException } from './problem-details.js';

/**
 * `IdempotencyModuleOptions.responseEncryption`: stored answers sealed with AES-256-GCM. Every key that may still be
 * needed to read a stored answer stays in `keys` (by id) until the answers it sealed have expired; `current` seals.
 */
export interface ResponseEncryption {
  /** By key id (letters, digits, `._-`, up to 64): 32 random bytes each, as a Buffer or base64. */
  keys: Record<string, Buffer | string>;
  /** The id of the key new answers are sealed with: one of `keys`. */
  current: string;
}

export interface ResolvedResponseEncryption {
  keys: ReadonlyMap<string, Buffer>;
  current: string;
}

/** The columns of a key row that hold its answer. `keyId` and `sealed` are null when the answer is stored in plain. */
export interface AnswerColumns {
  status: number;
  headers: Record<string, string>;
  body: string;
  keyId: string | null;
  sealed: Buffer | null;
}

/** The answer's columns as statement parameters: response_status, response_headers, response_body, response_key_id, response_sealed. */
export const answerParams = (columns: AnswerColumns) => [columns.status, columns.headers, columns.body, columns.keyId, columns.sealed];

/** A completed row's answer as read: the plain columns, and the sealed ones (null on a row stored in plain). */
export interface AnswerRow {
  id: string;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: string | null;
  response_key_id?: string | null;
  response_sealed?: Buffer | null;
}

export interface SealedAnswer {
  keyId: string;
  sealed: Buffer;
}

const KEY_ID = /^[A-Za-z0-9._-]{1,64}$/;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;
const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;
/** The envelope's first byte: its layout (version, IV, tag, ciphertext), so a later one can change it. */
const VERSION = 1;

/** Validates the option once, when the layer's options are resolved: a malformed key stops start-up, naming it (never its value). */
export function resolveResponseEncryption(option: ResponseEncryption | false | undefined): ResolvedResponseEncryption | false {
  if (option === undefined || option === false) return false;
  const name = 'IdempotencyModule: responseEncryption';
  if (typeof option !== 'object' || option === null || typeof option.keys !== 'object' || option.keys === null) {
    throw new Error(`${name} must be { keys: { [keyId]: Buffer | base64 }, current: keyId }`);
  }
  const keys = new Map<string, Buffer>();
  for (const [id, value] of Object.entries(option.keys)) {
    if (!KEY_ID.test(id)) throw new Error(`${name}.keys: the key id ${JSON.stringify(id)} must be 1-64 of A-Z a-z 0-9 . _ -`);
    const bytes = Buffer.isBuffer(value) ? value : typeof value === 'string' && BASE64.test(value) ? Buffer.from(value, 'base64') : null;
    if (bytes === null || bytes.length !== KEY_BYTES) {
      const got = bytes === null ? 'neither a Buffer nor base64' : `${bytes.length} bytes`;
      throw new Error(`${name}.keys.${id} must be ${KEY_BYTES} random bytes (AES-256), as a Buffer or base64: got ${got}`);
    }
    keys.set(id, Buffer.from(bytes));
  }
  if (keys.size === 0) throw new Error(`${name}.keys must hold at least one key`);
  if (!keys.has(option.current)) {
    throw new Error(
      `${name}.current must name one of responseEncryption.keys (${[...keys.keys()].join(', ')}): got ${JSON.stringify(option.current)}`,
    );
  }
  return { keys, current: option.current };
}

/**
 * Seals and opens stored answers (docs/running-it.md, "Stored answers encrypted at rest"). What is sealed is the whole
 * answer — status, replayed headers and body — as one JSON text: the body holds the personal data (a name, an
 * address, a note), and a header may too (a Location naming an e-mail, an app's own replayed header); sealing all
 * of it means nobody has to decide which header is harmless.
 *
 * Envelope: version (1 byte) ‖ IV (12 random bytes per seal) ‖ GCM tag (16) ‖ ciphertext. The key id lives in its own
 * column (`response_key_id`), so a rotation can count the rows an old key still reads. The additional data binds the
 * envelope to where it belongs — the key row's id for a stored answer, the (caller, key) slot in the replay cache —
 * and to its key id: an answer copied into another row, or relabelled with another key id, fails authentication.
 */
export class StoredResponseCipher {
  private readonly logger = new Logger('Idempotency');
  /** What the plain columns of a sealed row hold: what an older build (which cannot read the sealed one) replays. */
  private readonly placeholder: StoredResponse;

  constructor(
    private readonly encryption: ResolvedResponseEncryption | false,
    private readonly problemType: (slug: string) => string,
  ) {
    this.placeholder = {
      status: 503,
      headers: { 'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8`, 'retry-after': '1' },
      body: JSON.stringify({
        type: problemType('stored-answer-sealed'),
        title: 'The stored answer is encrypted',
        status: 503,
        detail: 'This instance cannot read encrypted answers (a deploy is under way): retry the request.',
      }),
    };
  }

  get enabled(): boolean {
    return this.encryption !== false;
  }

  /** The columns a key row gets for `response`: sealed for row `rowId` when encryption is on, else in plain. */
  columnsOf(rowId: string, response: StoredResponse): AnswerColumns {
    if (!this.encryption) return { ...response, keyId: null, sealed: null };
    return { ...this.placeholder, ...this.seal(response, rowId) };
  }

  /** A completed row's answer: opened when it was sealed (a 503 problem when it cannot be), else its plain columns. */
  responseOf(row: AnswerRow): StoredResponse {
    if (row.response_sealed == null) return { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! };
    return this.open({ keyId: row.response_key_id ?? '', sealed: row.response_sealed }, row.id);
  }

  /** `context`: where the answer belongs (a row id, a cache slot); opening it anywhere else fails. */
  seal(response: StoredResponse, context: string): SealedAnswer {
    if (!this.encryption) throw new Error('StoredResponseCipher: encryption is off');
    const keyId = this.encryption.current;
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.encryption.keys.get(keyId)!, iv, { authTagLength: TAG_BYTES });
    cipher.setAAD(additionalData(keyId, context));
    const plain = Buffer.from(JSON.stringify([response.status, response.headers, response.body]), 'utf8');
    const ciphertext = Buffer.concat([cipher.update(plain), cipher.final()]);
    return { keyId, sealed: Buffer.concat([Buffer.of(VERSION), iv, cipher.getAuthTag(), ciphertext]) };
  }

  open({ keyId, sealed }: SealedAnswer, context: string): StoredResponse {
    const key = this.encryption ? this.encryption.keys.get(keyId) : undefined;
    if (!key) {
      throw this.unreadable(
        context,
        `it was sealed with encryption key "${keyId}", which this server does not hold`,
        `sealed with unknown key id "${keyId}"`,
      );
    }
    if (sealed.length < 1 + IV_BYTES + TAG_BYTES || sealed[0] !== VERSION) {
      throw this.unreadable(context, `its envelope is malformed`, `malformed envelope (key id "${keyId}")`);
    }
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(1, 1 + IV_BYTES), { authTagLength: TAG_BYTES });
      decipher.setAAD(additionalData(keyId, context));
      decipher.setAuthTag(sealed.subarray(1 + IV_BYTES, 1 + IV_BYTES + TAG_BYTES));
      const plain = Buffer.concat([decipher.update(sealed.subarray(1 + IV_BYTES + TAG_BYTES)), decipher.final()]);
      const [status, headers, body] = JSON.parse(plain.toString('utf8')) as [number, Record<string, string>, string];
      return { status, headers, body };
    } catch {
      throw this.unreadable(
        context,
        `it does not authenticate under encryption key "${keyId}"`,
        `authentication failed under key id "${keyId}": altered, or moved from another row`,
      );
    }
  }

  /**
   * A 503, not a 500: the answer exists and the request must not run again, but this server cannot read it — a key
   * removed while answers it sealed were still live, or a row altered. The operator can fix it (put the key back).
   */
  private unreadable(context: string, why: string, logged: string): ProblemDetailsException {
    this.logger.error(`stored answer of key row ${context} cannot be read: ${logged}`);
    return new ProblemDetailsException({
      type: this.problemType('stored-answer-unreadable'),
      title: 'The stored answer cannot be read',
      status: 503,
      detail: `The answer stored under this Idempotency-Key cannot be read: ${why}. The request was not run again.`,
    });
  }
}

const additionalData = (keyId: string, context: string) => Buffer.from(`idempotency-answer\n${keyId}\n${context}`, 'utf8');
