// A Hugging Face folder to the network's model file and back
// (src/model/hf/convert.ts): the file serves the fixtures' logits, the export
// is the folder it came from tensor for tensor, and every bad folder is one
// clear line with nothing left behind.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { inferenceFromCheckpoint, inferenceFromFile } from '../../../src/inference/load.ts';
import { exportModelFile, importFolder, modelFileInfo } from '../../../src/model/hf/convert.ts';
import { gptConfigOfDecoder, ModelFolderError } from '../../../src/model/hf/decoder-config.ts';
import { engineTensor, engineTensorChunks } from '../../../src/model/hf/hf-weights.ts';
import { ParamLayout } from '../../../src/model/params.ts';
import { ModelFolder } from '../../../src/model/hf/model-folder.ts';
import { SafetensorsReader } from '../../../src/model/hf/safetensors-file.ts';
import { partCount, partParams, splitEvenly } from '../../../src/model/parts.ts';
import { checkWholeModel } from '../../../src/model/whole-model.ts';
import { TINY_LLAMA_CONFIG, writeRandomFolder } from '../../helpers/hf-folder.ts';
import { REFERENCE_CASES } from '../../helpers/hf-reference.ts';

const root = mkdtempSync(join(tmpdir(), 'nimble-convert-'));
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(() => {
  engine?.close();
  rmSync(root, { recursive: true, force: true });
});

const fixture = (name: string): { tokens: number[]; logits: number[][] } => JSON.parse(readFileSync(new URL(`../../fixtures/hf-reference/${name}.json`, import.meta.url), 'utf8'));

for (const c of REFERENCE_CASES.filter((x) => ['llama-bf16', 'qwen2-f32', 'gpt2-f32', 'llama3-rope-f32'].includes(x.name))) {
  test(`${c.name}: import writes one model file that serves PyTorch's logits; export gives the folder back tensor for tensor`, async () => {
    const dir = join(root, c.name);
    writeRandomFolder(dir, c.hfConfig, { dtype: c.dtype, seed: c.seed, scale: c.scale });
    const file = join(root, `${c.name}.safetensors`);
    const r = importFolder(dir, file);
    assert.equal(r.dtype, c.dtype, 'the stored dtype is kept');
    assert.equal(statSync(file).size, r.bytes);
    assert.match(r.model, /^(llama|qwen2|gpt2):v512\./);
    const bytes = new Uint8Array(readFileSync(file));
    assert.equal(checkWholeModel(bytes).model, r.model, 'the store takes it as a whole model of its reference');
    // the served logits, two stages, one token at a time
    const f = fixture(c.name);
    const stages = splitEvenly(r.config, 2).map((range) => inferenceFromCheckpoint(engine, bytes, range, { maxSessions: 1 }));
    let max = 0;
    try {
      for (const s of stages) s.join('s');
      f.tokens.forEach((tok, p) => {
        let x: Int32Array | Float32Array = new Int32Array([tok]);
        for (const s of stages) x = s.prefill('s', x);
        f.logits[p].forEach((v, i) => (max = Math.max(max, Math.abs(v - x[i]))));
      });
    } finally {
      for (const s of stages) s.release();
    }
    assert.ok(max <= 1e-4, `max |Δlogit| ${max}`);
    // a miner reads only its stage's tensors from the file on disk: the same weights
    for (const range of splitEvenly(r.config, 2)) {
      const fromFile = await inferenceFromFile(engine, file, range), fromBytes = inferenceFromCheckpoint(engine, bytes, range);
      assert.deepEqual(fromFile.params.flat.data, fromBytes.params.flat.data);
      fromFile.release();
      fromBytes.release();
    }
    // the tokenizer and config.json ride in the file
    const reader = SafetensorsReader.open(file);
    const info = modelFileInfo(reader.metadata);
    reader.close();
    assert.equal(info.hfConfig?.model_type, c.hfConfig.model_type);
    assert.ok(info.tokenizer && typeof info.tokenizer['tokenizer.json'] === 'object');
    // back to a folder: the same tensors, the same bytes of each
    const out = join(root, `${c.name}-export`);
    exportModelFile(file, out);
    const a = ModelFolder.open(dir), b = ModelFolder.open(out);
    try {
      assert.deepEqual([...b.entries.keys()].sort(), [...a.entries.keys()].sort());
      for (const name of a.entries.keys()) assert.deepEqual(b.read(name), a.read(name), name);
    } finally {
      a.close();
      b.close();
    }
    for (const f of ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json', 'config.json']) assert.ok(existsSync(join(out, f)), f);
    assert.equal(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).model_type, c.hfConfig.model_type);
  });
}

test('an import writes each engine tensor in pieces of rows that join to the whole tensor, transposed and fused ones included', () => {
  for (const c of REFERENCE_CASES.filter((x) => ['llama-bf16', 'qwen2-f32', 'gpt2-f32'].includes(x.name))) {
    const dir = join(root, `${c.name}-chunks`);
    writeRandomFolder(dir, { ...c.hfConfig, tie_word_embeddings: false }, { dtype: c.dtype, seed: c.seed, scale: c.scale });
    const folder = ModelFolder.open(dir);
    try {
      const config = gptConfigOfDecoder(folder.config);
      for (let p = 0; p < partCount(config); p++) {
        for (const e of new ParamLayout(partParams(config, p)).entries) {
          const pieces = [...engineTensorChunks(folder, e, 7)];
          const joined = new Float32Array(e.size);
          let at = 0;
          for (const piece of pieces) {
            joined.set(piece, at);
            at += piece.length;
          }
          assert.equal(at, e.size, e.name);
          if (e.shape.length === 2 && e.shape[1] <= 7) assert.equal(pieces.length, e.shape[0], `${e.name}: one row a piece`);
          assert.deepEqual(joined, engineTensor(folder, e), `${c.name} ${e.name}`);
        }
      }
    } finally {
      folder.close();
    }
  }
});

test('export in another dtype rounds as PyTorch does; a byte-level GPT file does not export', () => {
  const c = REFERENCE_CASES.find((x) => x.name === 'llama-f32')!;
  const dir = join(root, 'dtype');
  writeRandomFolder(dir, c.hfConfig, { dtype: 'F32', seed: 3 });
  const file = join(root, 'dtype.safetensors');
  importFolder(dir, file, { dtype: 'BF16' });
  const out = join(root, 'dtype-export');
  assert.equal(exportModelFile(file, out, { dtype: 'F32' }).dtype, 'F32');
  const a = ModelFolder.open(dir), b = ModelFolder.open(out);
  try {
    const name = 'model.layers.0.self_attn.k_proj.weight';
    const x = a.read(name), y = b.read(name);
    for (let i = 0; i < x.length; i++) assert.ok(Math.abs(x[i] - y[i]) <= Math.abs(x[i]) / 128, `${name}[${i}]`);
  } finally {
    a.close();
    b.close();
  }
});

test('a bad folder is one clear line, and nothing is left at the output', () => {
  const make = (name: string, hf: Record<string, unknown> = TINY_LLAMA_CONFIG): string => {
    const dir = join(root, 'bad', name);
    writeRandomFolder(dir, hf, { seed: 5 });
    return dir;
  };
  const cases: [string, () => string, RegExp][] = [
    ['an unsupported model_type', () => {
      const d = make('type');
      writeFileSync(join(d, 'config.json'), JSON.stringify({ ...TINY_LLAMA_CONFIG, model_type: 'mamba' }));
      return d;
    }, /model_type "mamba" is not supported/],
    ['a shape that disagrees with the config', () => {
      const d = make('shape');
      writeFileSync(join(d, 'config.json'), JSON.stringify({ ...TINY_LLAMA_CONFIG, intermediate_size: 96 }));
      return d;
    }, /do not match config.json.*mlp\.gate_proj\.weight/],
    ['a truncated weights file', () => {
      const d = make('truncated');
      const f = join(d, 'model.safetensors');
      truncateSync(f, statSync(f).size - 100);
      return d;
    }, /model\.safetensors: .*truncated|runs past the end/],
    ['a tokenizer whose vocabulary does not fit vocab_size', () => {
      const d = make('vocab');
      const tok = JSON.parse(readFileSync(join(d, 'tokenizer.json'), 'utf8'));
      tok.added_tokens.push({ id: 600, content: '<extra>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
      writeFileSync(join(d, 'tokenizer.json'), JSON.stringify(tok));
      return d;
    }, /tokenizer\.json: token ids go up to 600, past the model's vocab_size 512/],
    ['a missing tokenizer', () => {
      const d = make('notok');
      rmSync(join(d, 'tokenizer.json'));
      return d;
    }, /tokenizer\.json/],
  ];
  for (const [label, dir, why] of cases) {
    const out = join(root, 'bad', `${label.replace(/ /g, '-')}.safetensors`);
    assert.throws(() => importFolder(dir(), out), (err: Error) => err instanceof ModelFolderError && why.test(err.message) && !err.message.includes('\n'), label);
    assert.ok(!existsSync(out), `${label}: nothing at the output`);
    assert.deepEqual(readdirSync(join(root, 'bad')).filter((f) => f.includes('.partial-')), [], `${label}: no partial file`);
  }
});
