// Paid completion requests (docs/inference.md, "Payment";
// src/orchestrator/serving/billing.ts drives them): each POST
// /v1/completions reserves the most it may cost from its key's wallet before
// it is generated, is charged what its tokens cost once it ends (never more
// than it reserved), and is allocated to the epoch that closes next, whose
// payment draws it from the wallet's credit escrows. Beside each request, the
// rows each miner ran for it at each stage: what splits the miners' share.
//
// The price and owner of a published model are read from the ModelRegistry
// once (neither can change there) and kept in model_prices.
//
// Request: reserved → charged (tokens and wei set) | released (nothing was
// run). While it runs, what it has processed is written as it goes (the rows
// each miner ran, the tokens sampled: `recordProgress`, a few times a second),
// so a generation the orchestrator's crash cut short is charged at the next
// start for what it had processed, and its miners' rows are not lost.
// `epoch` is set on a charged request when the epoch that pays it closes.
// Wei exceed SQLite's 64-bit integers: amounts are text, summed in BigInt.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, type Migrations, type StateDb } from './db.ts';

export const INFERENCE_REQUEST_MIGRATIONS: Migrations = {
  store: 'inference-requests',
  steps: [
    `CREATE TABLE inference_requests (
      id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_id TEXT NOT NULL, deployment_id TEXT NOT NULL, model_owner TEXT NOT NULL,
      price TEXT NOT NULL, reserved TEXT NOT NULL, charged TEXT, tokens INTEGER, completion_id TEXT, status TEXT NOT NULL,
      epoch INTEGER, created_at INTEGER NOT NULL, settled_at INTEGER
    );
    CREATE INDEX inference_requests_by_owner ON inference_requests (owner, status, epoch);
    CREATE INDEX inference_requests_unallocated ON inference_requests (status, epoch);
    CREATE TABLE inference_request_work (
      request_id TEXT NOT NULL, miner TEXT NOT NULL, stage INTEGER NOT NULL, rows INTEGER NOT NULL,
      PRIMARY KEY (request_id, miner, stage)
    );
    CREATE TABLE model_prices (
      sha256 TEXT PRIMARY KEY, owner TEXT NOT NULL, price TEXT NOT NULL, read_at INTEGER NOT NULL
    )`,
    // what a generation under way has processed, written as it goes (null on rows reserved before: released at a restart)
    `ALTER TABLE inference_requests ADD COLUMN prompt_tokens INTEGER;
    ALTER TABLE inference_requests ADD COLUMN reserved_tokens INTEGER;
    ALTER TABLE inference_requests ADD COLUMN sampled INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE inference_requests ADD COLUMN ran INTEGER NOT NULL DEFAULT 0`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });

export const RequestStatus = Type.Union([Type.Literal('reserved'), Type.Literal('charged'), Type.Literal('released')]);
export type RequestStatus = Static<typeof RequestStatus>;

const RequestRow = Type.Object({
  /** `req-…` */
  id: Type.String(),
  /** the wallet that pays (the key's owner) */
  owner: Type.String(),
  keyId: Type.String(),
  deploymentId: Type.String(),
  /** the model's owner on the ModelRegistry: it receives the price minus the miners' share */
  modelOwner: Type.String(),
  /** wei per 1,000 tokens */
  price: Wei,
  /** wei held from the balance while it runs */
  reserved: Wei,
  /** wei charged (≤ reserved) */
  charged: Type.Union([Wei, Type.Null()]),
  /** tokens charged: prompt and generated */
  tokens: Type.Union([Int, Type.Null()]),
  completionId: Type.Union([Type.String(), Type.Null()]),
  status: RequestStatus,
  /** the epoch that pays it */
  epoch: Type.Union([Int, Type.Null()]),
  createdAt: Int,
  settledAt: Type.Union([Int, Type.Null()]),
  /** the prompt's tokens (null: reserved by an earlier version) */
  promptTokens: Type.Union([Int, Type.Null()]),
  /** tokens the reservation covers: prompt + max_tokens (null: an earlier version) */
  reservedTokens: Type.Union([Int, Type.Null()]),
  /** tokens sampled so far, as last recorded */
  sampled: Int,
  /** 1 once a stage ran it (its prompt is then charged) */
  ran: Type.Union([Type.Literal(0), Type.Literal(1)]),
});
export type InferenceRequestRecord = Static<typeof RequestRow>;
const COLUMNS = `id, owner, key_id AS keyId, deployment_id AS deploymentId, model_owner AS modelOwner, price, reserved, charged, tokens,
  completion_id AS completionId, status, epoch, created_at AS createdAt, settled_at AS settledAt, prompt_tokens AS promptTokens,
  reserved_tokens AS reservedTokens, sampled, ran`;
const decode = rowReader(RequestRow, 'inference request');

const WorkRow = Type.Object({ miner: Type.String(), stage: Int, rows: Int });
export type RequestWorkRecord = Static<typeof WorkRow>;
const decodeWork = rowReader(WorkRow, 'inference request work');

const AmountRow = Type.Object({ amount: Type.Union([Wei, Type.Null()]) });
const decodeAmount = rowReader(AmountRow, 'inference request amount');

/** What reserving a request records. */
export interface NewInferenceRequest {
  id: string;
  owner: string;
  keyId: string;
  deploymentId: string;
  modelOwner: string;
  price: bigint;
  reserved: bigint;
  /** the prompt's tokens */
  promptTokens: number;
  /** tokens the reservation covers: prompt + max_tokens */
  tokens: number;
}

const decodeAt = rowReader(Type.Object({ at: Type.Union([Int, Type.Null()]) }), 'inference request time');

const PriceRow = Type.Object({ owner: Type.String(), price: Wei });
const decodePrice = rowReader(PriceRow, 'model price');

export class InferenceRequestStore {
  constructor(private readonly db: StateDb) {}

  /** The price (wei per 1,000 tokens) and owner of the model with this sha256, as read from the ModelRegistry. */
  price(sha256: string): { owner: string; price: bigint } | undefined {
    const r = one(this.db, decodePrice, 'SELECT owner, price FROM model_prices WHERE sha256 = ?', sha256);
    return r && { owner: r.owner, price: BigInt(r.price) };
  }

  setPrice(sha256: string, owner: string, price: bigint, now: number): void {
    this.db.run(
      'INSERT INTO model_prices (sha256, owner, price, read_at) VALUES (?, ?, ?, ?) ON CONFLICT (sha256) DO UPDATE SET owner = excluded.owner, price = excluded.price, read_at = excluded.read_at',
      sha256,
      owner,
      price.toString(),
      now,
    );
  }

  reserve(r: NewInferenceRequest, now: number): void {
    this.db.run(
      `INSERT INTO inference_requests (id, owner, key_id, deployment_id, model_owner, price, reserved, status, created_at, prompt_tokens, reserved_tokens)
       VALUES (?, ?, ?, ?, ?, ?, ?, 'reserved', ?, ?, ?)`,
      r.id,
      r.owner,
      r.keyId,
      r.deploymentId,
      r.modelOwner,
      r.price.toString(),
      r.reserved.toString(),
      now,
      r.promptTokens,
      r.tokens,
    );
  }

  /**
   * What a reserved request has processed so far: `rows` more run by each
   * miner at each stage, `sampled` tokens in all, its completion id. Nothing
   * changes once it is charged or released.
   */
  recordProgress(id: string, p: { sampled: number; completionId: string | null; rows: readonly { miner: string; stage: number; rows: number }[] }): void {
    if (this.db.run("UPDATE inference_requests SET sampled = ?, ran = 1, completion_id = COALESCE(?, completion_id) WHERE id = ? AND status = 'reserved'", p.sampled, p.completionId, id).changes === 0) return;
    for (const r of p.rows) if (r.rows > 0) this.addWork(id, r.miner, r.stage, r.rows);
  }

  /** Requests still reserved (at start: the generations the last process left unfinished). */
  reserved(): InferenceRequestRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM inference_requests WHERE status = 'reserved' ORDER BY created_at, id`);
  }

  /** When the oldest charge no epoch pays yet was made (null: none). */
  oldestUnallocatedAt(): number | null {
    const r = one(this.db, decodeAt, "SELECT MIN(settled_at) AS at FROM inference_requests WHERE status = 'charged' AND epoch IS NULL");
    return r?.at ?? null;
  }

  get(id: string): InferenceRequestRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM inference_requests WHERE id = ?`, id);
  }

  /** reserved → charged; false when it was not reserved (charged or released already: nothing changes). */
  charge(id: string, c: { tokens: number; charged: bigint; completionId: string | null }, now: number): boolean {
    const sql = "UPDATE inference_requests SET status = 'charged', tokens = ?, charged = ?, completion_id = ?, settled_at = ? WHERE id = ? AND status = 'reserved'";
    return this.db.run(sql, c.tokens, c.charged.toString(), c.completionId, now, id).changes > 0;
  }

  /** reserved → released; false when it was not reserved. */
  release(id: string, now: number): boolean {
    return this.db.run("UPDATE inference_requests SET status = 'released', settled_at = ? WHERE id = ? AND status = 'reserved'", now, id).changes > 0;
  }


  /** Wei `owner` has reserved for requests under way. */
  reservedOf(owner: string): bigint {
    return sum(all(this.db, decodeAmount, "SELECT reserved AS amount FROM inference_requests WHERE owner = ? AND status = 'reserved'", owner));
  }

  /** Wei charged to `owner` and not yet allocated to an epoch. */
  unallocatedOf(owner: string): bigint {
    return sum(all(this.db, decodeAmount, "SELECT charged AS amount FROM inference_requests WHERE owner = ? AND status = 'charged' AND epoch IS NULL", owner));
  }

  /** Wei ever charged to `owner`. */
  spentOf(owner: string): bigint {
    return sum(all(this.db, decodeAmount, "SELECT charged AS amount FROM inference_requests WHERE owner = ? AND status = 'charged'", owner));
  }

  /** Charged requests no epoch pays yet, oldest first. */
  unallocated(): InferenceRequestRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM inference_requests WHERE status = 'charged' AND epoch IS NULL ORDER BY created_at, id`);
  }

  setEpoch(id: string, epoch: number): void {
    this.db.run('UPDATE inference_requests SET epoch = ? WHERE id = ? AND epoch IS NULL', epoch, id);
  }

  /** Adds `rows` run by `miner` at `stage` for request `id`. */
  addWork(id: string, miner: string, stage: number, rows: number): void {
    this.db.run(
      'INSERT INTO inference_request_work (request_id, miner, stage, rows) VALUES (?, ?, ?, ?) ON CONFLICT (request_id, miner, stage) DO UPDATE SET rows = inference_request_work.rows + excluded.rows',
      id,
      miner,
      stage,
      rows,
    );
  }

  work(id: string): RequestWorkRecord[] {
    return all(this.db, decodeWork, 'SELECT miner, stage, rows FROM inference_request_work WHERE request_id = ? ORDER BY miner, stage', id);
  }
}

function sum(rows: readonly { amount: string | null }[]): bigint {
  return rows.reduce((a, r) => a + (r.amount === null ? 0n : BigInt(r.amount)), 0n);
}
