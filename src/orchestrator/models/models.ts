// The model store: whole-model checkpoints developers keep on the network to
// publish them on the ModelRegistry (docs/jobs.md, "Publish"). A model comes
// from a checkpoint of one of the developer's own jobs, or from an uploaded
// safetensors file checked as a whole Nimble checkpoint: a GPT, or an MLP
// classifier (src/model/whole-model.ts; its row and view name its kind and
// model reference, so what serves models tells the two apart). It is kept as a
// blob named by its sha256, with a row (../state/models.ts) that the
// collector respects: a stored model outlives its job's checkpoint retention.
//
// The anti-front-running rule: the orchestrator attests a sha256 only for
// the address that stored it first (a job's checkpoint belongs to the job's
// owner, who alone may store it or upload the same bytes). Anyone who copies
// a pending `publish` from the mempool holds an attestation for someone else's
// address; the registry refuses it from any other sender, and a fresh one for
// the copier's own address is refused here.
import type { Address } from 'viem';
import type { AttestationView, StoredModelView } from '../../api/models.ts';
import { checkWholeModel, checkWholeModelFile, type WholeModel, type WholeModelConfig } from '../../model/whole-model.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { blobId, type BlobStore } from '../blobs/blobs.ts';
import type { ModelAttester, SignedAttestation } from './model-attester.ts';
import type { StoreBudget } from '../blobs/store-budget.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { ModelRecord, NewModel } from '../state/models.ts';

/** Largest file a developer uploads to publish (gpt-small is about 20 MB). */
export const MAX_MODEL_BYTES = 256 << 20;
/**
 * Model uploads received at once (all developers together): any wallet may
 * upload, so uploads take one share of the body budget and never crowd out
 * the miners' merge uploads.
 */
export const MAX_MODEL_UPLOADS_AT_ONCE = 1;
/** Models one address may keep in the store. */
export const MAX_MODELS_PER_OWNER = 64;

/** What the attestation says besides the hash and the owner. */
export interface PublishTerms {
  name: string;
  pricePer1kTokens: bigint;
  metadataURI: string;
}

const UINT256_MAX = 2n ** 256n - 1n;

export class ModelService {
  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
    /** null: the orchestrator runs without a chain, nothing can be published */
    private readonly attester: ModelAttester | null,
    /** the store's bounds and prices (../blobs/store-budget.ts; null: none, as in tests of the store alone) */
    private readonly budget: StoreBudget | null = null,
    private readonly now: () => number = Date.now,
  ) {}

  /** What a store request must pass before any bytes are read: a chain to publish on, and room for one more model of `owner`. */
  admit(owner: string): ModelAttester {
    if (!this.attester) throw noChain();
    if (this.state.models.countOf(owner) >= MAX_MODELS_PER_OWNER) throw new NimbleError('too_many_models', `${owner} keeps ${MAX_MODELS_PER_OWNER} models in this store already`, 429);
    return this.attester;
  }

  /** Stores a checkpoint of one of `owner`'s jobs (its last one unless `step`); `paid`: kept paid until then (a store past the free allowance). */
  async storeFromJob(owner: Address, jobId: string, step: number | undefined, name: string, paid?: Paid): Promise<ModelRecord> {
    this.admit(owner);
    const job = this.state.jobs.get(jobId);
    if (!job) throw new NimbleError('not_found', `unknown job ${jobId}`);
    if (job.owner.toLowerCase() !== owner.toLowerCase()) throw new NimbleError('forbidden', `the checkpoints of ${jobId} are its owner's: only ${job.owner} may publish them`);
    const list = this.state.jobs.checkpoints(jobId);
    const cp = step === undefined ? list.at(-1) : list.find((c) => c.step === step);
    if (!cp) throw new NimbleError('not_found', step === undefined ? `${jobId} has no checkpoint yet` : `${jobId} has no checkpoint at step ${step} (it has: ${list.map((c) => c.step).join(', ') || 'none'})`);
    const bytes = await this.blobs.get(cp.blob); // checked against its id
    const info = checkWholeModel(bytes);
    return this.keep({ sha256: cp.blob, owner, name, bytes: bytes.length, ...kindOf(info), jobId, step: cp.step }, bytes, paid);
  }

  /** Stores an uploaded whole-model checkpoint. */
  async storeFile(owner: Address, bytes: Uint8Array, name: string, paid?: Paid): Promise<ModelRecord> {
    this.admit(owner);
    if (bytes.length > MAX_MODEL_BYTES) throw new NimbleError('too_large', `a model file may have at most ${MAX_MODEL_BYTES} bytes, this one has ${bytes.length}`, 413);
    const info = checkWholeModel(bytes);
    const sha256 = blobId(bytes);
    const others = this.state.jobs.checkpointOwners(sha256).filter((o) => o.toLowerCase() !== owner.toLowerCase());
    if (others.length) throw new NimbleError('forbidden', `model ${sha256} is a checkpoint of a job of ${others[0]}: only that job's owner may publish it`);
    return this.keep({ sha256, owner, name, bytes: bytes.length, ...kindOf(info), jobId: null, step: info.step }, bytes, paid);
  }

  /**
   * Stores a model file uploaded in chunks (./model-uploads.ts): its file at
   * `path` already hashes to `sha256`; it is checked one tensor at a time and
   * moved into the blob store streamed.
   */
  async storeUploaded(owner: Address, path: string, sha256: string, bytes: number, name: string, paid?: Paid): Promise<ModelRecord> {
    this.admit(owner);
    const info = await checkWholeModelFile(path);
    const others = this.state.jobs.checkpointOwners(sha256).filter((o) => o.toLowerCase() !== owner.toLowerCase());
    if (others.length) throw new NimbleError('forbidden', `model ${sha256} is a checkpoint of a job of ${others[0]}: only that job's owner may publish it`);
    return this.keep({ sha256, owner, name, bytes, ...kindOf(info), jobId: null, step: info.step }, { path }, paid);
  }

  /** The orchestrator's attestation that the model's owner may publish it with `terms`. */
  async attest(model: ModelRecord, terms: PublishTerms): Promise<AttestationView> {
    const attester = this.attester;
    if (!attester) throw noChain();
    if (terms.pricePer1kTokens < 0n || terms.pricePer1kTokens > UINT256_MAX) throw new NimbleError('invalid', 'pricePer1kTokens must fit a uint256');
    const a = await attester.attest({ checkpointSha256: `0x${model.sha256}`, owner: model.owner as Address, ...terms });
    return attestationView(a);
  }

  get(sha256: string): ModelRecord {
    const m = this.state.models.get(sha256);
    if (!m) throw new NimbleError('not_found', `no stored model ${sha256}`);
    return m;
  }

  /**
   * Records the model (the first owner of a sha256 keeps it), then makes sure
   * its bytes are in the blob store: the row first, so the collector, which
   * deletes only blobs no row names, cannot take them in between.
   */
  private async keep(m: NewModel, content: Uint8Array | { path: string }, paid?: Paid): Promise<ModelRecord> {
    const held = this.state.models.get(m.sha256);
    if (held && held.owner.toLowerCase() !== m.owner.toLowerCase()) {
      throw new NimbleError('conflict', `model ${m.sha256} was stored first by ${held.owner}: the first to store a checkpoint owns it, and only its owner gets an attestation`);
    }
    const holder = this.state.models.nameOwner(m.name);
    if (holder && holder.toLowerCase() !== m.owner.toLowerCase()) this.state.models.claimName(m.name, m.owner, this.now()); // throws name_taken
    let keptUntil = 0;
    if (!held && this.budget) {
      // the bounds before anything is paid, the payment before anything is kept
      await this.budget.admit(m.bytes, paid !== undefined);
      if (paid) keptUntil = await this.budget.pay(m.owner, `model ${m.sha256}`, m.bytes, paid.days, paid.payment, this.now());
    }
    const { record, created } = this.state.models.claim({ ...m, keptUntil }, this.now());
    if (record.owner.toLowerCase() !== m.owner.toLowerCase()) {
      throw new NimbleError('conflict', `model ${m.sha256} was stored first by ${record.owner}: the first to store a checkpoint owns it, and only its owner gets an attestation`);
    }
    try {
      if (content instanceof Uint8Array) await this.blobs.put(content);
      else await this.blobs.putFile(content.path, m.sha256);
    } catch (err) {
      if (created) this.state.models.forget(m.sha256);
      throw err;
    }
    return record;
  }
}

/** A store paid for `days` by transaction `payment` (none on an unpaid network). */
export interface Paid {
  days: number;
  payment?: string;
}

/** What a row records of a checked model: its kind, reference and config. */
function kindOf(m: WholeModel): WholeModelConfig & { model: string } {
  return m.kind === 'gpt' ? { kind: 'gpt', model: m.model, config: m.config } : { kind: 'mlp', model: m.model, config: m.config };
}

function noChain(): NimbleError {
  return new NimbleError('no_chain', 'this orchestrator runs without a chain (--no-chain): models cannot be published on it', 409);
}

/** `budget`: says when an unpublished model is collected (`expiresAt`; null: published, kept). */
export function storedModelView(m: ModelRecord, budget?: StoreBudget | null): StoredModelView {
  const view: StoredModelView = { sha256: m.sha256, owner: m.owner, name: m.name, bytes: m.bytes, kind: m.kind, model: m.model, config: m.config, jobId: m.jobId, step: m.step, createdAt: m.createdAt };
  return budget ? { ...view, expiresAt: budget.expiresAt(m) } : view;
}

function attestationView(a: SignedAttestation): AttestationView {
  return {
    chainId: a.chainId,
    registry: a.registry,
    signer: a.signer,
    checkpointSha256: a.checkpointSha256.toLowerCase(),
    owner: a.owner,
    name: a.name,
    metadataURI: a.metadataURI,
    pricePer1kTokens: a.pricePer1kTokens.toString(),
    deadline: a.deadline.toString(),
    signature: a.signature,
  };
}
