// A whole-model checkpoint, as a developer publishes it: a Nimble GPT
// checkpoint (./checkpoint.ts) that holds every part of its model, exactly the
// tensors those parts name with their shapes, all values finite. What the
// model store accepts from an upload (src/orchestrator/models.ts), and from a
// job's checkpoint.
import { checkpointInfo, MLP_CHECKPOINT_FORMAT, type CheckpointInfo } from './checkpoint.ts';
import { partCount, partParams } from './gpt.ts';
import { decodeSafetensors, SafetensorsError } from './safetensors.ts';

/**
 * Decodes and checks a whole-model checkpoint; a SafetensorsError (400) names
 * the first problem. An MLP classifier's checkpoint (nimble-mlp/1) is refused
 * by name: published models are GPTs, served for generation.
 */
export function checkWholeModel(bytes: Uint8Array): CheckpointInfo {
  const file = decodeSafetensors(bytes);
  if (file.metadata.format === MLP_CHECKPOINT_FORMAT) {
    throw new SafetensorsError('this is an MLP classifier checkpoint: the model registry publishes GPT checkpoints (served for generation), not classifiers yet; download it with nbcli checkpoint download');
  }
  const info = checkpointInfo(file);
  const parts = partCount(info.config);
  if (info.from !== 0 || info.to !== parts) throw new SafetensorsError(`the checkpoint holds parts [${info.from}, ${info.to}) of ${parts}: a published model must hold all of them`);
  const expected = new Set<string>();
  for (let p = 0; p < parts; p++) {
    for (const spec of partParams(info.config, p)) {
      expected.add(spec.name);
      const t = file.tensors.get(spec.name);
      if (!t) throw new SafetensorsError(`the checkpoint lacks ${spec.name}`);
      if (t.shape.join(',') !== spec.shape.join(',')) throw new SafetensorsError(`${spec.name}: shape [${t.shape.join(', ')}] in the file, [${spec.shape.join(', ')}] expected`);
      for (let i = 0; i < t.data.length; i++) {
        if (!Number.isFinite(t.data[i])) throw new SafetensorsError(`${spec.name}: non-finite value at ${i}`);
      }
    }
  }
  for (const name of file.tensors.keys()) {
    if (!expected.has(name)) throw new SafetensorsError(`the checkpoint has a tensor its model does not name: ${name.slice(0, 80)}`);
  }
  return info;
}
