// Who may read a blob's bytes (docs/security.md, "Who may read what"): the
// one decision every route that serves blob bytes asks (GET /blobs/:id, a
// stored model's file, a job's checkpoint, a run's checkpoint, the operator's
// downloads), read from the domains' stores. Blob ids are not secrets (the
// public views name datasets and models by sha256), so what a party may read
// follows from what it is, never from what it knows:
//
// - a miner (a joined miner's session-signed request) reads what its work
//   names now: its stage's merged state and the checkpoint the stage starts
//   from, the dataset of the run it trains when its stage reads data (the
//   first and the last), the slices of the partitions it merges in its
//   stage's open round and the round's merged partitions once they are to be
//   applied, and the file of the deployment it serves;
// - a developer (any signed request, by its address) reads its own: the
//   datasets it uploaded, its jobs' checkpoints, the models it stored, its
//   runs' checkpoints;
// - anyone reads a stored model's file once it is published on the
//   ModelRegistry (until then it is its owner's, and its serving miners');
// - the operator (the dashboard's login) reads everything its orchestrator
//   holds.
//
// Anything else is refused with the same 403 whether the blob exists or not,
// so a refusal tells nothing about what is stored.
import { isDatasetId } from '../../data/dataset.ts';
import { modelParts } from '../../model/model-ref.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { OrchestratorState } from '../state/index.ts';

/** Who asks. */
export type BlobReader =
  /** nobody known: an unsigned request */
  | { kind: 'anyone' }
  /** a signed request: `miner` when it is a joined miner's, signed with its session key */
  | { kind: 'signer'; address: string; miner: boolean }
  /** the orchestrator's operator (the dashboard's login) */
  | { kind: 'operator' };

/** The reader of a request: anyone when unsigned; a miner when signed with a joined miner's session key. */
export function blobReaderOf(signed: { signer: string; scheme: 'wallet' | 'session' } | undefined): BlobReader {
  return signed ? { kind: 'signer', address: signed.signer, miner: signed.scheme === 'session' } : { kind: 'anyone' };
}

/** Why a read is allowed (what the blob is to the reader). */
export type BlobGrant =
  | 'published_model'
  | 'own_dataset'
  | 'own_checkpoint'
  | 'own_model'
  | 'stage_state'
  | 'initial_state'
  | 'training_data'
  | 'merge_slice'
  | 'merged_partition'
  | 'served_model'
  | 'operator';

/** Whether a stored model is published (on the ModelRegistry). */
export interface ModelPublication {
  published(sha256: string): Promise<boolean>;
}

/** A registry that finds a model by its sha256 (the ModelRegistry, ../models/deployment-registry.ts) as a ModelPublication. */
export function publicationOf(registry: { lookup(sha256: string): Promise<unknown> }): ModelPublication {
  return { published: async (sha256) => (await registry.lookup(sha256)) !== null };
}

/** A "not published" answer is asked again after this long (a model just published becomes public this soon). */
export const UNPUBLISHED_RECHECK_MS = 5_000;
/** Answers remembered at most (published models, and recent "not yet"s). */
const MAX_REMEMBERED = 10_000;

const sameAddress = (a: string | null | undefined, b: string): boolean => typeof a === 'string' && a.toLowerCase() === b.toLowerCase();

export class BlobAccess {
  /** sha256 → published (true, for good) or not yet (the time it was asked) */
  private readonly publication = new Map<string, true | number>();

  constructor(
    private readonly state: OrchestratorState,
    /** null: nothing is ever published (a network without a chain) */
    private readonly registry: ModelPublication | null,
    private readonly now: () => number = Date.now,
  ) {}

  /** Why `reader` may read blob `id`; a 403 when it may not. */
  async authorize(reader: BlobReader, id: string): Promise<BlobGrant> {
    const grant = this.grantOf(reader, id) ?? ((await this.isPublishedModel(id)) ? 'published_model' : null);
    if (grant) return grant;
    throw new NimbleError('forbidden', refusal(reader, id, this.state.models.get(id) !== undefined), 403);
  }

  /** Whether `reader` may download the checkpoint assembled from run `runId`'s stage states: its owner's (and the operator's). */
  authorizeRun(reader: BlobReader, runId: string): void {
    if (reader.kind === 'operator') return;
    const run = this.state.runs.get(runId);
    if (reader.kind === 'signer' && run && sameAddress(run.owner, reader.address)) return;
    throw new NimbleError('forbidden', `the checkpoint of run ${runId} is its owner's`, 403);
  }

  /** The grant that needs no chain read, or null. */
  private grantOf(reader: BlobReader, id: string): BlobGrant | null {
    if (reader.kind === 'operator') return 'operator';
    if (reader.kind === 'anyone') return null;
    return this.ownGrant(reader.address, id) ?? (reader.miner ? this.workGrant(reader.address, id) : null);
  }

  /** What a developer reads of its own. */
  private ownGrant(address: string, id: string): BlobGrant | null {
    const { state } = this;
    if (state.datasets.heldBy(id, address)) return 'own_dataset';
    if (state.jobs.checkpointOwners(id).some((o) => sameAddress(o, address))) return 'own_checkpoint';
    if (sameAddress(state.models.get(id)?.owner, address)) return 'own_model';
    return null;
  }

  /** What a miner's work names now. */
  private workGrant(minerId: string, id: string): BlobGrant | null {
    const { state } = this;
    const served = state.deployments.replicaOf(minerId);
    if (served) {
      const d = state.deployments.get(served.deploymentId);
      if (d && d.status !== 'undeployed' && d.sha256 === id) return 'served_model';
    }
    const a = state.runs.assignmentOf(minerId);
    if (!a) return null;
    const run = state.runs.get(a.runId);
    const stage = run && state.runs.stage(run.id, a.stage);
    if (!run || !stage) return null;
    if (stage.stateBlob === id) return 'stage_state';
    if (run.options.init === id) return 'initial_state';
    // the edge stages read the run's data (a middle stage never sees it)
    if (isDatasetId(run.data) && run.data.slice('sha256:'.length) === id && (stage.fromPart === 0 || stage.toPart === modelParts(run.model))) return 'training_data';
    const key = { runId: run.id, stage: stage.stage, round: stage.round + 1 };
    const round = state.mergeRounds.get(key);
    if (!round || round.status === 'done' || !round.replicas.includes(minerId)) return null;
    if (round.status === 'merging' || round.status === 'applying') {
      // the slices of the partitions it merges (mergers may be replaced: the plan as it is now)
      const merges = new Set(round.plan.mergers.flatMap((m, p) => (m.includes(minerId) ? [p] : [])));
      if (merges.size > 0 && state.mergeRounds.uploads(key).some((u) => u.blob === id && merges.has(u.partition))) return 'merge_slice';
    }
    if (round.status === 'applying' && (round.plan.chosen ?? []).includes(id)) return 'merged_partition';
    return null;
  }

  /** Whether `id` is a stored model published on the registry (a positive answer is kept; a negative one for UNPUBLISHED_RECHECK_MS). */
  private async isPublishedModel(id: string): Promise<boolean> {
    if (!this.registry || !this.state.models.get(id)) return false;
    const known = this.publication.get(id);
    if (known === true) return true;
    if (known !== undefined && this.now() - known < UNPUBLISHED_RECHECK_MS) return false;
    const published = await this.registry.published(id);
    if (this.publication.size >= MAX_REMEMBERED) this.publication.delete(this.publication.keys().next().value!);
    this.publication.delete(id);
    this.publication.set(id, published ? true : this.now());
    return published;
  }
}

function refusal(reader: BlobReader, id: string, isModel: boolean): string {
  const what = `blob ${id.slice(0, 16)}…`;
  if (isModel) return `model ${id.slice(0, 16)}… is not published: until it is, its file is its owner's${reader.kind === 'anyone' ? ' (sign the request as its owner)' : ''}`;
  if (reader.kind !== 'signer') return `${what} is not public: sign the request as a party it belongs to`;
  return `${what} is not ${reader.address}'s to read: a miner reads only what its current work names, a developer only its own`;
}
