// nbcli model import|export: a Hugging Face model folder (Llama, Mistral,
// Qwen2, GPT-2: config.json, safetensors weights, tokenizer.json and
// tokenizer_config.json) into the network's model store, and a model back out
// as such a folder (docs/models.md). Import converts the folder into one
// model file (src/model/hf/convert.ts: weights, config and tokenizer,
// streamed one tensor at a time) and publishes it as `model publish --file`
// does; `--local` only writes the file. Export takes a published model (by
// name or sha256, downloaded and checked against the chain) or a local file
// (`--file`) and writes the folder PyTorch and transformers load.
import { mkdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { Command } from 'commander';
import type { FloatDtype } from '../../model/hf/dtype.ts';
import { exportModelFile, importFolder } from '../../model/hf/convert.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { ChainCommandOptions } from '../chain-options.ts';
import { emit, resolveDataDir } from '../common.ts';
import type { ModelSource } from './model-publish.ts';

/** What publishing reads of a command's flags (./model.ts). */
export interface PublishFlags extends ChainCommandOptions {
  orchestrator: string;
  name?: string;
  pricePer1kTokens?: string;
  metadataUri?: string;
  keepDays?: string;
  'wallet.name'?: string;
  owner?: string;
}

/** What import and export share with `model publish` and `model download` (given by ./model.ts, which registers them). */
export interface ModelStoreCommands {
  publish(flags: PublishFlags, source: ModelSource): Promise<void>;
  download(flags: PublishFlags, ref: string, out: string): Promise<{ path: string }>;
}

interface ImportFlags extends PublishFlags {
  dtype?: string;
  out?: string;
  local?: boolean;
}

interface ExportFlags extends PublishFlags {
  out?: string;
  file?: string;
  dtype?: string;
  merge?: string;
}

const DTYPES: Record<string, FloatDtype> = { f32: 'F32', bf16: 'BF16', f16: 'F16' };

function dtypeOf(flag: string | undefined): FloatDtype | undefined {
  if (flag === undefined) return undefined;
  const d = DTYPES[flag.toLowerCase()];
  if (!d) throw new NimbleError('invalid', `--dtype must be f32, bf16 or f16, got '${flag}'`);
  return d;
}

const mb = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(1)} MB`;

/** Adds `import` and `export` to the `model` command group; `common` adds the shared options. */
export function registerModelImport(group: Command, common: (cmd: Command) => Command, store: ModelStoreCommands): void {
  common(
    group
      .command('import <dir>')
      .description('convert a Hugging Face model folder (llama, mistral, qwen2, gpt2) into a model file and publish it in the network, as publish --file does')
      .option('--name <name>', 'the name on the registry (letters, digits, _ . -; up to 64)')
      .option('--dtype <dtype>', "the weights' dtype in the model file: f32, bf16 or f16 (default: the folder's)")
      .option('--out <file>', 'where the model file is written (default: <data-dir>/models/<name>.safetensors)')
      .option('--local', 'only write the model file; publish nothing')
      .option('--price-per-1k-tokens <nim>', 'what serving 1,000 generated tokens costs, in NIM', '0')
      .option('--metadata-uri <uri>', "where the model's metadata is (default: the orchestrator's GET /models/<sha256>)")
      .option('--keep-days <n>', "store it paid for N days (NIM per GB-day, paid first), as when the network's free store is full")
      .option('--wallet.name <name>', 'the wallet that owns and publishes the model (a file in <data-dir>/wallets/)'),
  ).action(async (dir: string, flags: ImportFlags) => {
    const dtype = dtypeOf(flags.dtype);
    if (!flags.local && !flags.name) throw new NimbleError('invalid', '--name is required (or --local to only write the model file)');
    const out = resolve(flags.out ?? join(resolveDataDir(flags), 'models', `${flags.name ?? 'imported'}.safetensors`));
    mkdirSync(dirname(out), { recursive: true });
    const started = Date.now();
    const r = importFolder(resolve(dir), out, dtype ? { dtype } : {});
    const seconds = (Date.now() - started) / 1000;
    const line = {
      event: 'imported', path: out, model: r.model, dtype: r.dtype, bytes: r.bytes, params: r.params, seconds,
      largestTensorBytes: r.largestTensorBytes, peakRssBytes: process.resourceUsage().maxRSS * 1024,
    };
    if (flags.local) {
      emit(flags, line, () => `${out}: ${r.model}, ${(r.params / 1e6).toFixed(1)} M parameters in ${r.dtype}, ${mb(r.bytes)} (${seconds.toFixed(1)} s)`);
      return;
    }
    if (!flags.json) process.stderr.write(`imported ${dir} as ${r.model} (${(r.params / 1e6).toFixed(1)} M parameters, ${r.dtype}, ${mb(r.bytes)}) into ${out}\n`);
    else process.stdout.write(JSON.stringify(line) + '\n');
    await store.publish(flags, { kind: 'file', path: out });
  });

  common(
    group
      .command('export [name]')
      .description('write a model (published: by name or sha256, checked against the chain; or a local model file with --file) as a Hugging Face folder')
      .option('--out <dir>', 'the folder to write (must not exist, or be empty)')
      .option('--file <path>', 'a local model file (as model import --local writes) instead of a published model')
      .option('--dtype <dtype>', "the weights' dtype: f32, bf16 or f16 (default: the model file's)")
      .option('--merge <adapter-dir>', "merge a LoRA adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors) into the weights written")
      .option('--owner <address>', 'the owner, when several published that name'),
  ).action(async (ref: string | undefined, flags: ExportFlags) => {
    if (!flags.out) throw new NimbleError('invalid', '--out DIR is required: the folder to write');
    if ((ref === undefined) === (flags.file === undefined)) throw new NimbleError('invalid', 'give a published model (a name or sha256) or --file PATH, not both');
    const dtype = dtypeOf(flags.dtype);
    const out = resolve(flags.out);
    let file = flags.file === undefined ? null : resolve(flags.file);
    let downloaded: string | null = null;
    if (file === null) {
      downloaded = join(resolveDataDir(flags), 'models', `export-${process.pid}-${Date.now()}.safetensors`);
      mkdirSync(dirname(downloaded), { recursive: true });
      file = (await store.download(flags, ref!, downloaded)).path;
    } else if (!statSync(file, { throwIfNoEntry: false })?.isFile()) {
      throw new NimbleError('not_found', `${file}: no such model file`);
    }
    try {
      const mergeAdapter = flags.merge === undefined ? undefined : resolve(flags.merge);
      const r = exportModelFile(file, out, { ...(dtype ? { dtype } : {}), ...(mergeAdapter ? { mergeAdapter } : {}) });
      emit(flags, { event: 'exported', path: out, dtype: r.dtype, bytes: r.bytes, ...(mergeAdapter ? { merged: mergeAdapter } : {}) }, () => `${out}: a ${r.config.arch?.family} model folder, ${mb(r.bytes)} of ${r.dtype} weights${mergeAdapter ? `, ${mergeAdapter} merged in` : ''}`);
    } finally {
      if (downloaded) rmSync(downloaded, { force: true });
    }
  });
}
