// A job spec's local data on its way to the network (docs/jobs.md, "Data"):
// `nbcli job submit` and `nbcli up --job` pack the file or folder the spec
// names (a relative path is taken from the spec file's folder) exactly as
// `job run --local` does (src/data/dataset.ts), ask the orchestrator whether
// the developer uploaded those bytes already, upload them if not (a progress
// line for large ones), and submit the spec with `data` rewritten to the
// dataset's id, `sha256:<hex>`.
import { dirname, resolve } from 'node:path';
import type { OrchestratorClient } from '../../api/client.ts';
import { DatasetClient } from '../../api/dataset-client.ts';
import { checkCorpusSize, datasetHex, isDatasetId, packDataset, type PackedDataset } from '../../data/dataset.ts';
import { jobModel, NAMED_DATA_SETS, type JobSpec } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { emit, type CommonOptions } from '../common.ts';
import { ProgressBar } from '../progress.ts';

/** Uploads larger than this show a progress line. */
const PROGRESS_FROM_BYTES = 4 << 20;

/** Whether a spec's data is a local path (not a named data set, not a dataset id). */
export function isLocalData(data: string): boolean {
  return !(NAMED_DATA_SETS as readonly string[]).includes(data) && !isDatasetId(data);
}

/** Packs the local data of `spec` (read from `specFile`), checked against its model's context: what would be uploaded. */
export function packJobData(spec: JobSpec, specFile: string): PackedDataset {
  const model = jobModel(spec.model);
  if (model.kind !== 'gpt') throw new NimbleError('invalid', `an MLP classifier trains on a named data set (${NAMED_DATA_SETS.join(', ')}), not '${spec.data}'`);
  const packed = packDataset(resolve(dirname(specFile), spec.data));
  checkCorpusSize(packed.bytes.length, model.config.contextLength, `the data '${spec.data}'`);
  return packed;
}

/**
 * The spec to submit: unchanged when its data is named or an id already,
 * else with the local data (`packedBefore`, or packed now) uploaded unless
 * the developer's is stored already, and `data` set to its `sha256:` id.
 */
export async function uploadJobData(api: OrchestratorClient, spec: JobSpec, specFile: string, flags: CommonOptions, packedBefore?: PackedDataset): Promise<JobSpec> {
  if (!isLocalData(spec.data)) return spec;
  const packed = packedBefore ?? packJobData(spec, specFile);
  const hex = datasetHex(packed.id);
  const datasets = new DatasetClient(api);
  const me = (await api.signed()).address;
  const summary = { path: spec.data, id: packed.id, bytes: packed.bytes.length, files: packed.files.length, skipped: packed.skipped };
  const skipped = packed.skipped.length ? `; skipped ${packed.skipped.length} (${packed.skipped.slice(0, 3).map((s) => `${s.path}: ${s.why}`).join(', ')}${packed.skipped.length > 3 ? ', …' : ''})` : '';
  const packedWords = `${spec.data}: ${packed.files.length} file${packed.files.length === 1 ? '' : 's'}, ${mb(packed.bytes.length)} packed as ${packed.id}${skipped}`;
  if (await datasets.get(hex, me)) {
    emit(flags, { event: 'dataset', ...summary, uploaded: false }, () => `${packedWords}; already on the network, not uploaded again`);
    return { ...spec, data: packed.id };
  }
  const bar = !flags.json && packed.bytes.length >= PROGRESS_FROM_BYTES ? new ProgressBar('uploading dataset') : null;
  const t0 = performance.now();
  const tenths = (n: number): number => Math.round(n / 1e5) / 10;
  const { dataset } = await datasets.upload(packed.bytes, hex, (sent, total) => bar?.update({ done: tenths(sent), total: tenths(total), text: 'MB', elapsedMs: performance.now() - t0 }));
  if (dataset.id !== packed.id) throw new NimbleError('corrupt', `the orchestrator stored ${dataset.id} for ${packed.id}`);
  const seconds = (performance.now() - t0) / 1000;
  emit(flags, { event: 'dataset', ...summary, uploaded: true, ms: Math.round(seconds * 1000) }, () => `${packedWords}; uploaded in ${seconds.toFixed(1)} s`);
  return { ...spec, data: packed.id };
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(2)} MB`;
}
