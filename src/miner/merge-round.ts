// The miner's half of a merge round, in one place. A round of a stage runs in
// up to four steps, each announced by the merge task of a heartbeat reply:
//   1. upload: this replica's pseudo-gradient, one int8 frame per partition
//      (with error feedback), and the inner steps it took (its weight);
//   2. merge: for each partition assigned to it, download every replica's
//      frame of it, aggregate them and upload the merged partition;
//   3. apply: download every merged partition and take the outer step, so
//      that every replica of the stage ends with the same weights;
//   4. save: a stage's single replica, which merges nothing, uploads its
//      state (weights and outer momentum); a merged round's state is written
//      by the orchestrator.
// Training pauses while a round this replica has not applied is open. The
// frames go through a `MergeTransport`: the orchestrator's routes over HTTP in
// a miner, memory in tests.
import type { SignedClient } from '../http/client.ts';
import { mergeSlices, type MergeRule } from '../merge/merge-partition.ts';
import type { Partition } from '../merge/partition.ts';
import { decodePartitionFrame, decodePartitionFrames, encodeMergedPartition, encodePseudoGradientPartitions } from '../merge/pseudo-gradient.ts';
import type { MergeTask } from '../protocol/messages.ts';
import type { StageRunner } from './stage-runner.ts';
import type { Tamper } from './tamper.ts';

/** One merge round of one stage of a run. */
export interface RoundRef {
  runId: string;
  stage: number;
  round: number;
}

/** Where a merge round's frames go and come from. */
export interface MergeTransport {
  /** uploads this replica's pseudo-gradient frame of one partition, with the inner steps it took */
  putPseudoGradient(at: RoundRef, partition: number, samples: number, frame: Uint8Array): Promise<void>;
  /** uploads a partition this replica merged */
  putMerged(at: RoundRef, partition: number, frame: Uint8Array): Promise<void>;
  /** uploads the stage state after the round is applied */
  putState(at: RoundRef, state: Uint8Array): Promise<void>;
  /** downloads a blob: a replica's pseudo-gradient frame or a merged partition */
  getBlob(id: string): Promise<Uint8Array>;
}

/** The orchestrator's merge routes (docs/network.md), signed by the miner. */
export function httpMergeTransport(client: Pick<SignedClient, 'request'>): MergeTransport {
  const base = (at: RoundRef): string => `/runs/${at.runId}/stages/${at.stage}/rounds/${at.round}`;
  return {
    putPseudoGradient: async (at, partition, samples, frame) => void (await client.request('POST', `${base(at)}/pseudo-gradients/${partition}?samples=${samples}`, frame)),
    putMerged: async (at, partition, frame) => void (await client.request('POST', `${base(at)}/merged/${partition}`, frame)),
    putState: async (at, state) => void (await client.request('POST', `${base(at)}/state`, state, undefined, stateUploadTimeoutMs(state.length))),
    getBlob: (id) => client.request('GET', `/blobs/${id}`),
  };
}

/** The slowest uplink a stage state's upload is given time for (a state can take up to 2 GiB: docs/protocol.md). */
export const STATE_UPLOAD_MIN_MBPS = 10;

/** How long a state of `bytes` may take to upload: 30 s and its transfer at STATE_UPLOAD_MIN_MBPS (the orchestrator's request timeout may end it sooner). */
export function stateUploadTimeoutMs(bytes: number): number {
  return 30_000 + (bytes * 8) / (STATE_UPLOAD_MIN_MBPS * 1e3);
}

export interface MergeRoundOptions {
  transport: MergeTransport;
  /** counters: bytes uploaded, partitions merged */
  stats: { bytesSent: number; merges: number };
  log(line: string): void;
  /** resolves once no microbatch work runs (the pseudo-gradient is taken after it) */
  idle(): Promise<void>;
  /** true once the miner is stopping */
  stopped(): boolean;
  /** wait this long before merging partitions: lets failure tests kill a merger mid-round */
  mergeDelayMs?: number;
  /** fault injection (tamper.ts) */
  tamper?: Tamper;
}

/** A replica's merge rounds: what it has uploaded, merged and saved, and the round under way. */
export class MergeRounds {
  /** the last round whose pseudo-gradient this replica uploaded in full */
  uploadedRound = 0;
  private savedRound = 0;
  /** partitions merged in the round under way, so a repeated task does not merge them again (older rounds are let go: never asked again) */
  private readonly merged = new Set<number>();
  /** the run/stage/round `merged` is of */
  private mergedRound = '';
  private running: Promise<void> | null = null;

  constructor(private readonly options: MergeRoundOptions) {}

  /** The stage was taken on, or its state loaded, at `round`: nothing of it is left to upload or save. */
  reset(round: number): void {
    this.uploadedRound = round;
    this.savedRound = round;
  }

  /** Runs `task` in the background unless a round's work is under way already. */
  start(runner: StageRunner, task: MergeTask): void {
    if (this.running) return;
    this.running = this.run(runner, task)
      .catch((err) => this.options.log(`merge round ${task.round} failed: ${(err as Error).message}`))
      .finally(() => (this.running = null));
  }

  /** Partitions remembered as merged (all of the round under way). */
  get mergedKept(): number {
    return this.merged.size;
  }

  /** Resolves when the round's work under way (if any) has ended. */
  async settled(): Promise<void> {
    await this.running;
  }

  /** Does this replica's part of the task: upload, merge, apply and save as it asks, each once. */
  async run(runner: StageRunner, task: MergeTask): Promise<void> {
    const { transport, stats } = this.options;
    const partitions: Partition[] = task.partitions.map((p) => ({ index: p.index, start: p.start, end: p.end }));
    const at: RoundRef = { runId: runner.runId, stage: runner.assignment.stage, round: task.round };
    if (task.round <= runner.round) {
      // applied already; maybe still asked to save the state
      if (task.saveState && this.savedRound < task.round && runner.round === task.round) await this.saveState(runner, at);
      return;
    }
    // wait for in-flight work to finish before taking the pseudo-gradient
    await this.options.idle();
    if (task.upload && this.uploadedRound < task.round) {
      const tamper = this.options.tamper;
      const frames = await pseudoGradientFrames(runner, partitions, at, tamper?.pseudoGradient);
      const samples = tamper?.samples ? tamper.samples(runner.samples) : runner.samples;
      for (let p = 0; p < frames.length; p++) {
        await transport.putPseudoGradient(at, p, samples, frames[p]);
        stats.bytesSent += frames[p].length;
      }
      this.uploadedRound = task.round;
    }
    if (task.merge.length && this.options.mergeDelayMs) await sleep(this.options.mergeDelayMs);
    const round = `${at.runId}/${at.stage}/${at.round}`;
    if (this.mergedRound !== round) {
      this.merged.clear();
      this.mergedRound = round;
    }
    for (const m of task.merge) {
      if (this.options.stopped()) return;
      if (this.merged.has(m.partition)) continue;
      const part = partitions[m.partition];
      const slices = [];
      for (const input of m.inputs) slices.push({ minerId: input.minerId, samples: input.samples, slice: decodePartitionFrame(await transport.getBlob(input.blob), part) });
      const frame = mergePartition(slices, { aggregator: task.aggregator, trim: task.trim, maxNorm: m.maxNorm }, part, at, this.options.tamper?.merged);
      await transport.putMerged(at, m.partition, frame);
      stats.bytesSent += frame.length;
      stats.merges++;
      this.merged.add(m.partition);
    }
    if (task.apply) {
      let delta: Float32Array | null = null;
      if (partitions.length) {
        const frames: Uint8Array[] = [];
        for (const a of [...task.apply].sort((x, y) => x.partition - y.partition)) frames.push(await transport.getBlob(a.blob));
        delta = decodeMergedDelta(frames, partitions);
      }
      await runner.applyOuterStep(delta, task.round, task.outerLr, task.outerMomentum);
      this.options.log(`applied merge round ${task.round}`);
      if (task.saveState) await this.saveState(runner, at);
    }
  }

  private async saveState(runner: StageRunner, at: RoundRef): Promise<void> {
    const bytes = await runner.encodeState(at.round);
    await this.options.transport.putState(at, bytes);
    this.options.stats.bytesSent += bytes.length;
    this.savedRound = at.round;
  }
}

// ---- the round's frames --------------------------------------------------------

/** The replica's pseudo-gradient as one int8 frame per partition, with its error feedback. */
export async function pseudoGradientFrames(runner: StageRunner, partitions: readonly Partition[], at: RoundRef, tamper?: (delta: Float32Array) => void): Promise<Uint8Array[]> {
  const delta = await runner.pseudoGradient();
  tamper?.(delta);
  return encodePseudoGradientPartitions(delta, partitions, runner.feedback, frameMeta(at));
}

/** Merges one partition from the replicas' decoded slices (src/merge/merge-partition.ts: the orchestrator checks it the same way), as a frame. */
export function mergePartition(slices: Parameters<typeof mergeSlices>[0], rule: MergeRule, partition: Partition, at: RoundRef, tamper?: (merged: Float32Array) => void): Uint8Array {
  const merged = mergeSlices(slices, rule);
  tamper?.(merged);
  return encodeMergedPartition(merged, partition, frameMeta(at));
}

/** The merged pseudo-gradient of the whole stage from its merged partitions' frames (in partition order). */
export function decodeMergedDelta(frames: readonly Uint8Array[], partitions: readonly Partition[]): Float32Array {
  return decodePartitionFrames(frames, partitions, undefined, { codecs: ['int8-block', 'f16', 'f32'] });
}

function frameMeta(at: RoundRef): { runId: string; stage: number; round: number } {
  return { runId: at.runId, stage: at.stage, round: at.round };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
