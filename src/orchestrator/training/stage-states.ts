// A stage's merged state after a merge round (its weights, outer momentum and
// outer step), or its initial weights before the first round: what spot
// checks bound a miner's weights against, and what merge rounds check
// uploaded pseudo-gradients and stage states against. Read from the state
// blobs (or made by the model's deterministic init), a few kept in memory;
// written as the same checkpoint a replica's StageRunner.encodeState makes.
import { encodeStageState, loadModelParams } from '../../model/checkpoint.ts';
import { initParams } from '../../model/init.ts';
import { parseModelRef, stageLayout } from '../../model/model-ref.ts';
import { decodeSafetensors, SafetensorsError } from '../../model/safetensors.ts';
import { findNonFinite } from '../../protocol/codec.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { RunRecord } from '../state/runs.ts';

export interface StageState {
  weights: Float32Array;
  momentum: Float32Array;
  /** outer steps taken */
  outerStep: number;
  /** floats [0, decaySize) take weight decay */
  decaySize: number;
}

/** States kept in memory. */
const CACHE_ENTRIES = 6;

export class StageStates {
  private readonly cache = new Map<string, StageState>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
  ) {}

  /** The stage's state after merge round `round` (the initial one for 0); null when its blob is not kept. */
  async at(run: RunRecord, stage: number, round: number): Promise<StageState | null> {
    const key = `${run.id}/${stage}/${round}`;
    const hit = this.cache.get(key);
    if (hit) return hit;
    const loaded = await this.load(run, stage, round);
    if (!loaded) return null;
    this.cache.set(key, loaded);
    while (this.cache.size > CACHE_ENTRIES) this.cache.delete(this.cache.keys().next().value!);
    return loaded;
  }

  /**
   * The blob holding the state after `round`: the one its round saved, or,
   * for a round that ended without one (every replica left it), the last
   * one saved before it; null for the initial state.
   */
  blobOf(run: RunRecord, stage: number, round: number): string | null {
    for (let r = round; r > 0; r--) {
      const merged = this.state.mergeRounds.get({ runId: run.id, stage, round: r });
      if (merged?.stateBlob) return merged.stateBlob;
      if (merged?.status !== 'done') break; // not a round that ended: nothing kept after it
    }
    const s = this.state.runs.stage(run.id, stage);
    return s && s.round === round ? s.stateBlob : null;
  }

  private async load(run: RunRecord, stage: number, round: number): Promise<StageState | null> {
    const s = this.state.runs.stage(run.id, stage);
    if (!s || round > s.round) return null; // not a round the stage has finished
    const blob = this.blobOf(run, stage, round);
    return this.decode(run, stage, blob ? await this.blobs.get(blob) : null);
  }

  /**
   * A stage state's bytes (a checkpoint of the stage's parts with its outer
   * momentum), checked and read: model, parts, shapes, finite values.
   * Without bytes, the stage's initial state: its parts of the checkpoint the
   * run starts from, or the model's seeded init (the same values a miner's
   * stage starts from: src/model/init.ts over the same layout). No kernel runs.
   */
  async decode(run: RunRecord, stage: number, bytes: Uint8Array | null): Promise<StageState> {
    const s = this.state.runs.stage(run.id, stage);
    if (!s) throw new SafetensorsError(`run ${run.id} has no stage ${stage}`);
    const model = parseModelRef(run.model);
    const range = { from: s.fromPart, to: s.toPart };
    const layout = stageLayout(model, range);
    const weights = new Float32Array(layout.size);
    const decaySize = layout.decaySize;
    if (!bytes) {
      if (run.options.init) loadModelParams(model, range, layout, weights, decodeSafetensors(await this.blobs.get(run.options.init)));
      else initParams(layout, weights, run.seed);
      return { weights, momentum: new Float32Array(layout.size), outerStep: 0, decaySize };
    }
    const file = decodeSafetensors(bytes);
    const info = loadModelParams(model, range, layout, weights, file);
    if (info.from !== s.fromPart || info.to !== s.toPart) throw new SafetensorsError(`the state holds parts [${info.from}, ${info.to}), the stage [${s.fromPart}, ${s.toPart})`);
    const m = file.tensors.get('outer.momentum');
    if (!m || m.data.length !== layout.size) throw new SafetensorsError('the state lacks the outer momentum');
    if (findNonFinite(m.data) >= 0) throw new SafetensorsError('the outer momentum is not finite');
    const outerStep = Number(file.metadata.outerStep ?? 0);
    if (!Number.isSafeInteger(outerStep) || outerStep < 0) throw new SafetensorsError(`outerStep ${file.metadata.outerStep} is not a step count`);
    return { weights, momentum: m.data.slice(), outerStep, decaySize };
  }

  /**
   * A stage state as the checkpoint a replica saves (encodeStageState, as
   * src/miner/stage-runner.ts encodeState writes it); its step is the round
   * it ends.
   */
  encode(run: RunRecord, stage: number, round: number, state: StageState): Uint8Array {
    const s = this.state.runs.stage(run.id, stage);
    if (!s) throw new SafetensorsError(`run ${run.id} has no stage ${stage}`);
    const model = parseModelRef(run.model);
    const range = { from: s.fromPart, to: s.toPart };
    const layout = stageLayout(model, range);
    if (state.weights.length !== layout.size || state.momentum.length !== layout.size) throw new SafetensorsError(`a state of ${state.weights.length} floats for a stage of ${layout.size}`);
    const tensors = layout.entries.map((e) => ({ name: e.name, shape: e.shape, data: state.weights.subarray(e.offset, e.offset + e.size) }));
    return encodeStageState(model, range, tensors, state, round);
  }

  clear(): void {
    this.cache.clear();
  }
}
