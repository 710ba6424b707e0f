// TEMPORARY STUB (lead's branch): replaced by the real client on merge.
import { Injectable } from '@nestjs/common';
export interface PspCharge { id: string; status: 'succeeded' | 'failed'; amountMinor: number; currency: string; source: string; failureCode: string | null; metadata: { orderId: string; paymentId: string }; createdAt: string }
export interface PspRefund { id: string; status: 'succeeded' | 'failed'; chargeId: string; amountMinor: number; failureCode: string | null; metadata: { refundId: string; paymentId: string }; createdAt: string }
export type PspCallResult<T> =
  | { kind: 'succeeded'; value: T }
  | { kind: 'declined'; value: T }
  | { kind: 'refused'; status: number; detail: string }
  | { kind: 'unknown'; reason: string }
  | { kind: 'breaker-open'; retryAfterSeconds: number };
export interface ChargeRequest { amountMinor: number; currency: string; source: string; metadata: { orderId: string; paymentId: string } }
export interface RefundRequest { chargeId: string; amountMinor: number; metadata: { refundId: string; paymentId: string } }
export class PspUnreachableError extends Error {}
@Injectable()
export class PspClient {
  createCharge(_b: ChargeRequest, _k: string, _d: number): Promise<PspCallResult<PspCharge>> { throw new Error('stub'); }
  createRefund(_b: RefundRequest, _k: string, _d: number): Promise<PspCallResult<PspRefund>> { throw new Error('stub'); }
  findChargesByPayment(_p: string): Promise<PspCharge[]> { throw new Error('stub'); }
  findRefundsByRefund(_r: string): Promise<PspRefund[]> { throw new Error('stub'); }
  chargeBreakerOpen(): { open: true; retryAfterSeconds: number } | { open: false } { return { open: false }; }
}
