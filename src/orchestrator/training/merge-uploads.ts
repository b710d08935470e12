// What replicas upload in a merge round, taken in: pseudo-gradient
// partitions (uploading), merged partitions (merging) and, for a stage of one
// replica (no merge), its state (applying), each only from a replica of that
// round in that phase, checked
// (src/orchestrator/training/merge-checks.ts) before it is stored. A replica whose
// upload proves an offence leaves the round at once. The round's phases
// move on in ./merges.ts.
import { modelCheckpointInfo } from '../../model/checkpoint.ts';
import { rangeParams } from '../../model/model-ref.ts';
import { decodePartitionFrame } from '../../merge/pseudo-gradient.ts';
import { decodeSafetensors } from '../../model/safetensors.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { MergeChecks } from './merge-checks.ts';
import { OffenceError } from '../rewards/offences.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MergeRoundRecord, RoundKey } from '../state/merge-rounds.ts';
import type { RunRecord, StageRecord } from '../state/runs.ts';

export class MergeUploads {
  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
    private readonly checks: MergeChecks,
    private readonly log: (line: string) => void = () => {},
  ) {}

  /** Throws unless round `k` is open with `minerId` among its replicas (in any phase): checked before an upload's body is read. */
  expectReplica(minerId: string, k: RoundKey): void {
    this.roundFor(k, minerId, null);
  }

  /**
   * Throws unless `minerId` may upload round `k`'s stage state: its stage's
   * single replica (a merged round's state is the orchestrator's). Returns
   * the most bytes that state can take (stateBytesBound), the upload's limit.
   */
  expectStateSaver(minerId: string, k: RoundKey): number {
    const { run, s, round } = this.roundFor(k, minerId, null);
    mergedRefused(k, round);
    return stateBytesBound(rangeParams(run.model, { from: s.fromPart, to: s.toPart }));
  }

  /** The open round `k` in phase `phase` (any, for null), with `minerId` among its replicas; else the reason it is not. */
  private roundFor(k: RoundKey, minerId: string, phase: MergeRoundRecord['status'] | null): { run: RunRecord; s: StageRecord; round: MergeRoundRecord } {
    const run = this.state.runs.get(k.runId);
    if (!run) throw new NimbleError('not_found', `unknown run ${k.runId}`);
    const s = this.state.runs.stage(k.runId, k.stage);
    if (!s) throw new NimbleError('not_found', `run ${k.runId} has no stage ${k.stage}`);
    const round = this.state.mergeRounds.get(k);
    if (!round || round.status === 'done') throw new NimbleError('conflict', `round ${k.round} of stage ${k.stage} is not open`);
    if (phase && round.status !== phase) throw new NimbleError('conflict', `round ${k.round} of stage ${k.stage} is ${round.status}, not ${phase}`);
    if (!round.replicas.includes(minerId)) throw new NimbleError('forbidden', `miner ${minerId} is not a replica in round ${k.round} of stage ${k.stage}`);
    return { run, s, round };
  }

  async putPseudoGradient(minerId: string, k: RoundKey, partition: number, samples: number, bytes: Uint8Array): Promise<string> {
    const { run, s, round } = this.roundFor(k, minerId, 'uploading');
    const p = this.checks.partitions(run, s, round.partitions)[partition];
    if (!p) throw new NimbleError('invalid', `partition ${partition} outside 0..${round.partitions - 1}`);
    // shape, codec, checksum, finite values, and every value within AdamW's reach; the weight is the steps credited
    const checked = await this.excludingOffender(k, minerId, () => this.checks.checkUpload(run, s, k, p, minerId, samples, bytes));
    const blob = await this.blobs.put(bytes);
    this.state.tx(() => {
      this.state.mergeRounds.putUpload(k, { minerId, partition, blob, samples: checked.samples, norm: checked.norm });
      this.state.runs.addCounters(k.runId, { bytes: bytes.length });
    });
    return blob;
  }

  /**
   * Runs a check of what `minerId` sent; when it proves an offence, the miner
   * leaves the round at once (it cannot finish it honestly, and the others
   * need not wait for its timeout) and takes the next round's state.
   */
  private async excludingOffender<T>(k: RoundKey, minerId: string, check: () => Promise<T>): Promise<T> {
    try {
      return await check();
    } catch (err) {
      const round = err instanceof OffenceError ? this.state.mergeRounds.get(k) : undefined;
      if (round && round.status !== 'done' && round.replicas.includes(minerId)) {
        this.state.mergeRounds.update(k, { replicas: round.replicas.filter((m) => m !== minerId) });
        this.log(`${minerId} leaves round ${k.round} of stage ${k.stage} of ${k.runId}: ${(err as Error).message}`);
      }
      throw err;
    }
  }

  /** A merger's result for a partition: stored once (a repeat changes nothing), credited when the round settles on it. */
  async putMerged(minerId: string, k: RoundKey, partition: number, bytes: Uint8Array): Promise<string> {
    const { run, s, round } = this.roundFor(k, minerId, 'merging');
    if (!round.plan.mergers[partition]?.includes(minerId)) throw new NimbleError('forbidden', `miner ${minerId} does not merge partition ${partition}`);
    const p = this.checks.partitions(run, s, round.partitions)[partition];
    decodePartitionFrame(bytes, p, { codecs: ['int8-block', 'f16', 'f32'] });
    if (this.state.mergeRounds.results(k).some((r) => r.partition === partition && r.minerId === minerId)) throw new NimbleError('conflict', `partition ${partition} was already merged by ${minerId}`);
    const blob = await this.blobs.put(bytes);
    this.state.tx(() => {
      this.state.mergeRounds.putResult(k, { partition, minerId, blob });
      this.state.runs.addCounters(k.runId, { bytes: bytes.length });
    });
    return blob;
  }

  /** The single replica's stage state after a round without a merge: checked against the round's start before it becomes the stage's state or anybody's checkpoint. */
  async putState(minerId: string, k: RoundKey, bytes: Uint8Array): Promise<string> {
    const { run, s, round } = this.roundFor(k, minerId, 'applying');
    mergedRefused(k, round);
    let info;
    try {
      info = modelCheckpointInfo(decodeSafetensors(bytes));
    } catch (err) {
      throw new NimbleError('invalid', `stage state: ${(err as Error).message}`);
    }
    if (info.from !== s.fromPart || info.to !== s.toPart || info.step !== k.round) {
      throw new NimbleError('invalid', `stage state holds parts [${info.from}, ${info.to}) round ${info.step}; expected [${s.fromPart}, ${s.toPart}) round ${k.round}`);
    }
    await this.excludingOffender(k, minerId, () => this.checks.checkState(run, s, round, bytes));
    const blob = await this.blobs.put(bytes);
    this.state.tx(() => {
      this.state.mergeRounds.update(k, { stateBlob: blob });
      this.state.runs.addCounters(k.runId, { bytes: bytes.length });
    });
    return blob;
  }
}

/** Room for a stage state's checkpoint header (tensor names, shapes, offsets, the model's reference): 1 MiB. */
const STATE_HEADER_BYTES = 1 << 20;

/** The most bytes a stage state of `params` parameters takes: float32 weights and outer momentum, and its checkpoint header. */
export function stateBytesBound(params: number): number {
  return 8 * params + STATE_HEADER_BYTES;
}

function mergedRefused(k: RoundKey, round: MergeRoundRecord): void {
  if (round.partitions > 0) throw new NimbleError('conflict', `round ${k.round} of stage ${k.stage} is merged: the orchestrator writes its state, no replica uploads it`);
}
