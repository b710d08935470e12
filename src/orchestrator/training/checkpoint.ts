// A run's whole model as one safetensors checkpoint, assembled from the
// stages' latest merged states (bytes rearranged, no kernels run; the outer
// optimizer's tensors are left out): a GPT checkpoint of all its parts, or
// an MLP classifier's (its one stage holds it whole). The metadata names the
// model reference (`model`) beside its config.
import { encodeModelCheckpoint, modelCheckpointInfo, modelCheckpointMetadata, type ModelCheckpointMeta } from '../../model/checkpoint.ts';
import { modelParts, parseModelRef, type ModelRef } from '../../model/model-ref.ts';
import { decodeSafetensors, type NamedTensor, type SafetensorsFile } from '../../model/safetensors.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { OrchestratorState } from '../state/index.ts';

/** A whole-model checkpoint assembled and not yet encoded. */
export interface AssembledCheckpoint {
  model: ModelRef;
  /** the checkpoint as `encode()` writes it, decoded: its tensors (views of the stages' states) and metadata */
  file: SafetensorsFile;
  /** the safetensors bytes, with the metadata `more` (held-out figures) after the rest */
  encode(more?: Record<string, string>): Uint8Array;
}

/**
 * `extra`: more metadata to record (a job's id); `progress`: the step and
 * tokens to record (a job's, counting the runs before this one), by default
 * the run's.
 */
export async function assembleWholeModel(
  state: OrchestratorState,
  blobs: BlobStore,
  runId: string,
  extra: Record<string, string> = {},
  progress?: { step: number; tokens: number },
): Promise<AssembledCheckpoint> {
  const run = state.runs.get(runId);
  if (!run) throw new NimbleError('not_found', `unknown run ${runId}`);
  const stages = state.runs.stages(runId);
  if (stages.length === 0 || stages.some((s) => !s.stateBlob)) throw new NimbleError('conflict', `run ${runId} has no merged state for every stage yet`);
  const model = parseModelRef(run.model);
  const tensors: NamedTensor[] = [];
  let round = Infinity;
  for (const s of stages) {
    const file = decodeSafetensors(await blobs.get(s.stateBlob!));
    round = Math.min(round, modelCheckpointInfo(file).step);
    for (const t of file.tensors.values()) if (!t.name.startsWith('outer.')) tensors.push(t);
  }
  const at = progress ?? { step: run.microbatchesDone, tokens: run.tokensDone };
  const meta = (more: Record<string, string> = {}): ModelCheckpointMeta => ({
    range: { from: 0, to: modelParts(model) },
    step: at.step,
    extra: { ...extra, model: model.ref, run: run.id, rounds: String(round), tokens: String(at.tokens), trainLoss: String(run.lastLoss ?? ''), ...more },
  });
  return {
    model,
    file: { tensors: new Map(tensors.map((t) => [t.name, t])), metadata: modelCheckpointMetadata(model, meta()) },
    encode: (more) => encodeModelCheckpoint(model, tensors, meta(more)),
  };
}

/** The run's whole model as safetensors bytes (assembleWholeModel, encoded). */
export async function assembleCheckpoint(
  state: OrchestratorState,
  blobs: BlobStore,
  runId: string,
  extra: Record<string, string> = {},
  progress?: { step: number; tokens: number },
): Promise<Uint8Array> {
  return (await assembleWholeModel(state, blobs, runId, extra, progress)).encode();
}
