// Writes a Hugging Face model folder: `config.json`, the weights as one
// `model.safetensors` or, past `maxShardBytes`, as shards
// `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`
// (transformers' own layout), and the tokenizer files given. Tensors are
// produced and written one at a time. Used by `nbcli model export` and by
// the script that makes random-weight folders for tests and benchmarks.
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ModelFolderError } from './decoder-config.ts';
import { dtypeBytes, type FloatDtype } from './dtype.ts';
import { INDEX_FILE, SINGLE_FILE } from './model-folder.ts';
import { writeSafetensorsFile, type TensorToWrite } from './safetensors-file.ts';

export interface FolderContents {
  /** config.json as transformers reads it */
  readonly hfConfig: Record<string, unknown>;
  /** every parameter tensor, by its Hugging Face name */
  readonly tensors: readonly TensorToWrite[];
  readonly dtype: FloatDtype;
  /** other JSON files to write beside them (tokenizer.json, tokenizer_config.json, generation_config.json) */
  readonly files?: Readonly<Record<string, unknown>>;
  /** shards of at most this many bytes of data (default 2 GiB, as transformers' save_pretrained cuts at 5 GB) */
  readonly maxShardBytes?: number;
  /** replace `dir` when it exists (default: refuse) */
  readonly overwrite?: boolean;
}

const TORCH_DTYPE: Record<FloatDtype, string> = { F32: 'float32', F16: 'float16', BF16: 'bfloat16' };

/**
 * Writes `contents` into `dir` (made if needed). The folder is written under
 * a temporary name beside it and renamed at the end, so a failure leaves no
 * half-written folder. Returns the data bytes written.
 */
export function writeModelFolder(dir: string, contents: FolderContents): number {
  if (existsSync(dir) && !contents.overwrite && readdirSync(dir).length > 0) throw new ModelFolderError(`${dir} exists and is not empty: choose another folder, or remove it first`);
  const tmp = `${dir}.partial-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    const maxShard = contents.maxShardBytes ?? 2 * 1024 ** 3;
    const size = (t: TensorToWrite): number => t.shape.reduce((a, b) => a * b, 1) * dtypeBytes(contents.dtype);
    const shards: TensorToWrite[][] = [[]];
    let inShard = 0;
    for (const t of contents.tensors) {
      if (inShard > 0 && inShard + size(t) > maxShard) {
        shards.push([]);
        inShard = 0;
      }
      shards[shards.length - 1].push(t);
      inShard += size(t);
    }
    let total = 0;
    const metadata = { format: 'pt' };
    if (shards.length === 1) {
      writeSafetensorsFile(join(tmp, SINGLE_FILE), shards[0], contents.dtype, metadata);
      total = shards[0].reduce((a, t) => a + size(t), 0);
    } else {
      const weightMap: Record<string, string> = {};
      shards.forEach((shard, i) => {
        const file = `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
        writeSafetensorsFile(join(tmp, file), shard, contents.dtype, metadata);
        for (const t of shard) {
          weightMap[t.name] = file;
          total += size(t);
        }
      });
      writeFileSync(join(tmp, INDEX_FILE), JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2) + '\n');
    }
    writeFileSync(join(tmp, 'config.json'), JSON.stringify({ ...contents.hfConfig, torch_dtype: TORCH_DTYPE[contents.dtype] }, null, 2) + '\n');
    for (const [name, value] of Object.entries(contents.files ?? {})) writeFileSync(join(tmp, name), JSON.stringify(value, null, 2) + '\n');
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
    return total;
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw err;
  }
}
