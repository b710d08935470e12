// What a completion costs and who it is charged to (docs/inference.md,
// "Payment"). A request to POST /v1/completions carries `Authorization:
// Bearer nk-…`, an API key bound to the wallet that created it; before
// generating, the most the request may cost, price × (prompt tokens +
// max_tokens) / 1000 at the model's price per 1,000 tokens on the
// ModelRegistry, is reserved from the wallet's credit (./credits.ts) in one
// SQLite transaction, or the request is refused (402); once it ends, even
// aborted, the tokens actually processed (the prompt, once a stage ran it,
// and every token generated) are charged and the rest released, once: the
// charge is a conditional update of the reservation. A price-0 model needs a
// key and no credit.
//
// The work log: an observer of the serving path (./completions.ts) counts the
// rows (tokens) each miner ran at each stage for each paid request (and each
// synthetic one, which nobody pays: `unpaid`); when the request is charged,
// the same transaction logs them as `inference` work,
// INFERENCE_TOKENS_PER_UNIT rows making one unit (about a training forward
// unit of a gpt-micro microbatch: 12 × 64 = 768 tokens), weighed at scoring
// by the stage's share of the model's parameters like training units, and
// earning emission like them. The same rows split the miners' share of what
// the request paid (./credits.ts).
//
// A crash of the orchestrator mid-generation loses neither: what each
// generation has processed (rows per miner and stage, tokens sampled) is
// written as it goes, at most PROGRESS_EVERY_MS apart; at the next start a
// paid request left reserved is charged for the prompt and the tokens sampled
// as last written (never more than it reserved) and its rows are logged as
// its miners' work, and a synthetic one's rows were logged as they were
// written. At most the last PROGRESS_EVERY_MS of a generation go uncharged.
import { createHash, randomBytes } from 'node:crypto';
import type { Address, Hex } from 'viem';
import type { ApiKeyView } from '../../api/credits.ts';
import { formatNim } from '../../chain/amounts.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { type CompletionRequest, OpenAiError } from './completion-request.ts';
import type { CompletionObserver, CompletionResult, StageStep } from './completions.ts';
import type { CreditService } from './credits.ts';
import type { ApiKeyRecord } from '../state/api-keys.ts';
import type { DeploymentRecord } from '../state/deployments.ts';
import type { OrchestratorState } from '../state/index.ts';

/** Rows (tokens) run through a stage that make one unit of inference work. */
export const INFERENCE_TOKENS_PER_UNIT = 1000;
/** What generations under way have processed is written at most this long apart: what a crash can leave uncharged. */
export const PROGRESS_EVERY_MS = 250;
/** Keys one wallet may hold unrevoked. */
export const MAX_API_KEYS_PER_OWNER = 32;

/** Reads a published model's price (wei per 1,000 tokens) and owner; null when it is not on the registry. */
export type PriceLookup = (sha256: string) => Promise<{ owner: string; price: bigint } | null>;

/** A request's reservation, from reserve to settle. */
export interface Reservation {
  id: string;
  owner: string;
  deployment: DeploymentRecord;
  price: bigint;
  /** tokens the reservation covers: prompt + max_tokens */
  tokens: number;
  promptTokens: number;
}

/** What the observer counted for one request's session (paid, or synthetic). */
interface Tally {
  requestId: string;
  /** false: synthetic traffic, billed to nobody (its rows are logged as work as they are written) */
  paid: boolean;
  deployment: DeploymentRecord;
  completionId: string;
  stages: number;
  /** rows per `${miner} ${stage}` */
  rows: Map<string, number>;
  /** the last stage's answers: one per token sampled */
  sampled: number;
  /** rows per `${miner} ${stage}` written so far (recordProgress, or logged as work for a synthetic one) */
  written: Map<string, number>;
  /** counted since last written */
  dirty: boolean;
}

/** sha256 of an API key, hex: all the orchestrator keeps of it. */
export function hashApiKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

/** Wei of `tokens` at `price` wei per 1,000 tokens, rounded up. */
export function costOf(price: bigint, tokens: number): bigint {
  return (price * BigInt(tokens) + 999n) / 1000n;
}

export function apiKeyView(k: ApiKeyRecord): ApiKeyView {
  return { id: k.id, name: k.name, prefix: k.prefix, owner: k.owner, createdAt: k.createdAt, lastUsedAt: k.lastUsedAt, revokedAt: k.revokedAt };
}

export class InferenceBilling {
  /** sessions of requests under way, by completion id */
  private readonly tallies = new Map<string, Tally>();
  private writtenAt: number;

  constructor(
    private readonly state: OrchestratorState,
    /** null: an unpaid network, every model free */
    private readonly credits: CreditService | null,
    private readonly lookup: PriceLookup | null,
    private readonly log: (line: string) => void = () => {},
    private readonly now: () => number = Date.now,
  ) {
    this.writtenAt = now();
    const { charged, released } = state.tx(() => this.finishLeftOver(this.writtenAt));
    if (charged > 0) log(`billing: charged ${charged} generation(s) the last run left unfinished for what they had processed; their miners' rows are logged as work`);
    if (released > 0) log(`billing: released ${released} reservation(s) of generations the last run left before they ran`);
  }

  /**
   * The requests a stopped orchestrator left reserved: each is charged the
   * prompt and the tokens sampled as last written (never more than it
   * reserved) and its miners' written rows are logged as work, or released
   * when it had run nothing.
   */
  private finishLeftOver(now: number): { charged: number; released: number } {
    let charged = 0;
    let released = 0;
    for (const r of this.state.inferenceRequests.reserved()) {
      if (r.ran === 0 || r.promptTokens === null || r.reservedTokens === null) {
        if (this.state.inferenceRequests.release(r.id, now)) released++;
        continue;
      }
      const tokens = Math.min(r.reservedTokens, r.promptTokens + r.sampled);
      if (!this.state.inferenceRequests.charge(r.id, { tokens, charged: costOf(BigInt(r.price), tokens), completionId: r.completionId }, now)) continue;
      for (const w of this.state.inferenceRequests.work(r.id)) {
        this.state.ledger.logWork(
          { minerId: w.miner, runId: null, deploymentId: r.deploymentId, kind: 'inference', units: w.rows / INFERENCE_TOKENS_PER_UNIT, stage: w.stage, detail: `${w.rows} rows of ${r.id} (cut short by a restart)` },
          now,
        );
      }
      charged++;
    }
    return { charged, released };
  }

  /** The observer to add to the serving path (Completions.observe). */
  observer(): CompletionObserver {
    return { stageStep: (step) => this.count(step) };
  }

  // ---- keys ----------------------------------------------------------------------

  createKey(owner: string, name: string | undefined): { key: string; apiKey: ApiKeyView } {
    return this.state.tx(() => {
      if (this.state.apiKeys.countActive(owner) >= MAX_API_KEYS_PER_OWNER) throw new NimbleError('too_many_keys', `${owner} holds ${MAX_API_KEYS_PER_OWNER} API keys already: revoke one first`, 429);
      const key = `nk-${randomBytes(24).toString('hex')}`;
      const id = `key-${randomBytes(6).toString('hex')}`;
      this.state.apiKeys.insert({ id, hash: hashApiKey(key), owner, name: name ?? id, prefix: key.slice(0, 9) }, this.now());
      return { key, apiKey: apiKeyView(this.state.apiKeys.get(id)!) };
    });
  }

  revokeKey(id: string, owner: string): ApiKeyView {
    const k = this.state.apiKeys.get(id);
    if (!k || k.owner !== owner) throw new NimbleError('not_found', `${owner} has no API key ${id}`);
    if (!this.state.apiKeys.revoke(id, owner, this.now())) throw new NimbleError('conflict', `API key ${id} was revoked already`);
    return apiKeyView(this.state.apiKeys.get(id)!);
  }

  /** The key of an `Authorization` header; a 401 in OpenAI's shape when it is missing, unknown or revoked. */
  authorize(header: string | undefined): ApiKeyRecord {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
    if (!m) throw new OpenAiError(401, 'no API key: send Authorization: Bearer nk-… (nbcli api-key create makes one)', 'invalid_api_key', null, 'invalid_request_error');
    const k = this.state.apiKeys.byHash(hashApiKey(m[1]));
    if (!k) throw new OpenAiError(401, `incorrect API key ${m[1].slice(0, 9)}…: nbcli api-key list shows yours`, 'invalid_api_key', null, 'invalid_request_error');
    if (k.revokedAt !== null) throw new OpenAiError(401, `API key ${k.id} was revoked`, 'invalid_api_key', null, 'invalid_request_error');
    return k;
  }

  // ---- a request --------------------------------------------------------------------

  /** The model's price (wei per 1,000 tokens) and owner: the registry's (read once), or free on an unpaid network. */
  async priceOf(d: DeploymentRecord): Promise<{ owner: string; price: bigint }> {
    const known = this.state.inferenceRequests.price(d.sha256);
    if (known) return known;
    if (!this.lookup) return { owner: d.owner, price: 0n };
    let found: { owner: string; price: bigint } | null;
    try {
      found = await this.lookup(d.sha256);
    } catch (err) {
      throw new OpenAiError(503, `cannot read model '${d.name}''s price from the ModelRegistry: ${(err as Error).message.split('\n')[0]}`.slice(0, 300), 'registry_unreachable');
    }
    if (!found) throw new OpenAiError(409, `model '${d.name}' is not on the ModelRegistry: it has no price`, 'model_not_published', 'model');
    this.state.inferenceRequests.setPrice(d.sha256, found.owner, found.price, this.now());
    return found;
  }

  /** Reserves the most request `r` may cost from `key`'s wallet; a 402 naming the balance and that cost when it is short. */
  async reserve(key: ApiKeyRecord, d: DeploymentRecord, r: CompletionRequest): Promise<Reservation> {
    const { owner: modelOwner, price } = await this.priceOf(d);
    const promptTokens = Math.max(1, r.prompt.length);
    const tokens = promptTokens + r.maxTokens;
    const most = costOf(price, tokens);
    const id = `req-${randomBytes(12).toString('hex')}`;
    this.state.tx(() => {
      const k = this.state.apiKeys.get(key.id);
      if (!k || k.revokedAt !== null) throw new OpenAiError(401, `API key ${key.id} was revoked`, 'invalid_api_key', null, 'invalid_request_error');
      if (most > 0n) {
        if (!this.credits) throw new OpenAiError(402, `model '${d.name}' costs NIM and this network takes no payment`, 'insufficient_quota', null, 'insufficient_quota');
        const balance = this.credits.available(key.owner);
        if (balance < most) {
          throw new OpenAiError(
            402,
            `${key.owner}'s balance is ${formatNim(balance)} NIM; this request may cost up to ${formatNim(most)} NIM (${tokens} tokens at ${formatNim(price)} NIM per 1,000): add credit with nbcli credit add, or ask for fewer max_tokens`,
            'insufficient_quota',
            null,
            'insufficient_quota',
          );
        }
      }
      this.state.apiKeys.touch(key.id, this.now());
      this.state.inferenceRequests.reserve({ id, owner: key.owner, keyId: key.id, deploymentId: d.id, modelOwner, price, reserved: most, promptTokens, tokens }, this.now());
    });
    return { id, owner: key.owner, deployment: d, price, tokens, promptTokens };
  }

  /**
   * Generates through `generate` for the network itself (synthetic traffic,
   * ./synthetic-prompts.ts): nobody is charged, and the rows each miner ran
   * are logged as `inference` work when it ends, so serving miners earn
   * emission without outside users.
   */
  async unpaid(d: DeploymentRecord, generate: (onId: (id: string) => void) => Promise<CompletionResult>): Promise<CompletionResult> {
    let id: string | null = null;
    try {
      return await generate((cid) => {
        id = cid;
        this.tallies.set(cid, this.tally(`synthetic ${cid}`, false, d, cid));
      });
    } finally {
      const t = id ? this.tallies.get(id) : undefined;
      if (id) this.tallies.delete(id);
      if (t?.dirty) this.state.tx(() => this.write(t, this.now()));
    }
  }

  private tally(requestId: string, paid: boolean, d: DeploymentRecord, completionId: string): Tally {
    const stages = Math.max(1, this.state.deployments.stages(d.id).length);
    return { requestId, paid, deployment: d, completionId, stages, rows: new Map(), sampled: 0, written: new Map(), dirty: false };
  }

  /** Logs rows (per `${miner} ${stage}`) of request `requestId` as each miner's `inference` work. */
  private logWork(d: DeploymentRecord, requestId: string, rows: ReadonlyMap<string, number>, now: number): void {
    for (const [key, n] of rows) {
      if (n <= 0) continue;
      const [miner, stage] = key.split(' ');
      this.state.ledger.logWork({ minerId: miner, runId: null, deploymentId: d.id, kind: 'inference', units: n / INFERENCE_TOKENS_PER_UNIT, stage: Number(stage), detail: `${n} rows of ${requestId}` }, now);
    }
  }

  /** The rows of `t` counted since they were last written, per `${miner} ${stage}`; marks them written. */
  private unwritten(t: Tally): Map<string, number> {
    const delta = new Map<string, number>();
    for (const [key, rows] of t.rows) {
      const d = rows - (t.written.get(key) ?? 0);
      if (d > 0) delta.set(key, d);
      t.written.set(key, rows);
    }
    t.dirty = false;
    return delta;
  }

  /** Writes what `t` processed since it was last written: a paid request's progress, or a synthetic one's rows as work (call inside a transaction). */
  private write(t: Tally, now: number): void {
    const delta = this.unwritten(t);
    if (!t.paid) return this.logWork(t.deployment, t.requestId, delta, now);
    const rows = [...delta].map(([key, n]) => ({ miner: key.split(' ')[0], stage: Number(key.split(' ')[1]), rows: n }));
    this.state.inferenceRequests.recordProgress(t.requestId, { sampled: t.sampled, completionId: t.completionId, rows });
  }

  /** Writes every generation under way that counted something since it was last written (a crash loses at most PROGRESS_EVERY_MS of them). */
  writeProgress(): void {
    this.writtenAt = this.now();
    const dirty = [...this.tallies.values()].filter((t) => t.dirty);
    if (dirty.length === 0) return;
    try {
      this.state.tx(() => {
        for (const t of dirty) this.write(t, this.writtenAt);
      });
    } catch (err) {
      for (const t of dirty) t.dirty = true;
      this.log(`billing: writing the progress of ${dirty.length} generation(s) failed, will retry: ${(err as Error).message.split('\n')[0]}`);
    }
  }

  /** Counts the stage steps of completion `completionId` for reservation `res` (call when its id is known, before any step). */
  track(res: Reservation, completionId: string): void {
    this.tallies.set(completionId, this.tally(res.id, true, res.deployment, completionId));
  }

  private count(step: StageStep): void {
    const t = this.tallies.get(step.session);
    if (!t) return;
    const key = `${step.minerId} ${step.stage}`;
    t.rows.set(key, (t.rows.get(key) ?? 0) + step.rows);
    if (step.stage === t.stages - 1) t.sampled++;
    t.dirty = true;
    if (this.now() - this.writtenAt >= PROGRESS_EVERY_MS) this.writeProgress();
  }

  /**
   * Charges what request `res` processed (`result` when it finished, else the
   * prompt once a stage ran it and each token sampled), never more than it
   * reserved, logs its miners' work, and releases the rest: in one
   * transaction, once. Nothing processed: the reservation is released.
   */
  settle(res: Reservation, completionId: string | null, result: CompletionResult | null): { tokens: number; charged: bigint } {
    const t = completionId ? this.tallies.get(completionId) : undefined;
    if (completionId) this.tallies.delete(completionId);
    const ran = t !== undefined && t.rows.size > 0;
    const processed = result ? result.promptTokens + result.completionTokens : ran ? res.promptTokens + t.sampled : 0;
    const tokens = Math.min(res.tokens, processed);
    const charged = costOf(res.price, tokens);
    const now = this.now();
    return this.state.tx(() => {
      if (!ran && tokens === 0) {
        this.state.inferenceRequests.release(res.id, now);
        return { tokens: 0, charged: 0n };
      }
      if (!this.state.inferenceRequests.charge(res.id, { tokens, charged, completionId }, now)) return { tokens: 0, charged: 0n };
      if (t) {
        // the rows not written yet join those written while it ran; all of them are its miners' work
        for (const [key, rows] of this.unwritten(t)) {
          const [miner, stage] = key.split(' ');
          this.state.inferenceRequests.addWork(res.id, miner, Number(stage), rows);
        }
        this.logWork(res.deployment, res.id, t.rows, now);
      }
      return { tokens, charged };
    });
  }
}

/** A ModelRegistry price lookup for `modelOfSha256`-like readers. */
export function registryPrices(read: (sha256: Hex) => Promise<{ owner: Address; pricePer1kTokens: bigint } | null>): PriceLookup {
  return async (sha256) => {
    const m = await read(`0x${sha256}`);
    return m ? { owner: m.owner, price: m.pricePer1kTokens } : null;
  };
}
