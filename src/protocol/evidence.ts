// Evidence that work was issued and handed on, so that credit and blame rest
// on signatures rather than on anyone's word:
//   - a ticket: the orchestrator's signature of a microbatch it issued (run,
//     id, attempt, shard, step). It travels with the activation, and every
//     stage checks it before computing, so nobody can make a miner work on a
//     microbatch the orchestrator did not issue;
//   - a receipt: a miner's session-key signature that it received a frame (an
//     activation or a gradient, by its sha256) of a microbatch's attempt. The
//     sender reports it, so the orchestrator can tell who held the microbatch
//     when it stalled.
import { verifySignature, type SessionKey } from './session-key.ts';

export interface TicketFields {
  runId: string;
  microbatch: number;
  attempt: number;
  shard: number;
  step: number;
}

export function ticketMessage(domain: string, t: TicketFields): string {
  return ['nimble-ticket/v1', domain, t.runId, t.microbatch, t.attempt, t.shard, t.step].join('\n');
}

export function signTicket(key: SessionKey, domain: string, t: TicketFields): string {
  return key.sign(ticketMessage(domain, t));
}

export function verifyTicket(orchestratorKey: string, domain: string, t: TicketFields, ticket: string): boolean {
  return verifySignature(orchestratorKey, ticketMessage(domain, t), ticket);
}

export interface ReceiptFields {
  runId: string;
  microbatch: number;
  attempt: number;
  /** the receiver's stage */
  stage: number;
  phase: 'forward' | 'backward';
  /** sha256 of the frame received */
  frameSha: string;
}

export function receiptMessage(domain: string, r: ReceiptFields): string {
  return ['nimble-receipt/v1', domain, r.runId, r.microbatch, r.attempt, r.stage, r.phase, r.frameSha].join('\n');
}

export function signReceipt(key: SessionKey, domain: string, r: ReceiptFields): string {
  return key.sign(receiptMessage(domain, r));
}

export function verifyReceipt(receiverKey: string, domain: string, r: ReceiptFields, receipt: string): boolean {
  return verifySignature(receiverKey, receiptMessage(domain, r), receipt);
}
