// LoRA against the independent PyTorch implementation (scripts/hf_reference.py
// --adapter, fixtures test/fixtures/hf-reference/*-lora-f32.json): the
// random base folders and random adapters in PEFT's layout the fixtures came
// from are made again here, read (src/model/hf/peft.ts), and the engine must
// give every position's logits within 1e-4 of PyTorch's, both unmerged (the
// training path: GptStage with the spec, base frozen) and merged into the
// base at load (the serving path: two stages over their KV caches), with
// the same 32 greedy tokens; and exported with the adapter merged in
// (`nbcli model export --merge`), as a plain folder that serves the same.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { StageInference, stageParamLayout } from '../../../src/inference/stage-inference.ts';
import type { GptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { exportModelFile, importFolder } from '../../../src/model/hf/convert.ts';
import { gptConfigOfDecoder } from '../../../src/model/hf/decoder-config.ts';
import { hfWeights } from '../../../src/model/hf/hf-weights.ts';
import { ModelFolder } from '../../../src/model/hf/model-folder.ts';
import { readPeftAdapter, type PeftAdapter } from '../../../src/model/hf/peft.ts';
import { copyByName, loraLayout } from '../../../src/model/lora.ts';
import { partCount, splitEvenly } from '../../../src/model/parts.ts';
import { writeRandomFolder } from '../../helpers/hf-folder.ts';
import { LORA_REFERENCE_CASES, REFERENCE_GREEDY_STEPS, writeRandomAdapter } from '../../helpers/hf-reference.ts';

interface Fixture {
  tokens: number[];
  greedy: number[];
  logits: number[][];
}

const root = mkdtempSync(join(tmpdir(), 'nimble-lora-ref-'));
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(() => {
  engine?.close();
  rmSync(root, { recursive: true, force: true });
});

const fixture = (name: string): Fixture => JSON.parse(readFileSync(new URL(`../../fixtures/hf-reference/${name}.json`, import.meta.url), 'utf8')) as Fixture;

const argmax = (row: Float32Array): number => {
  let best = 0;
  for (let v = 1; v < row.length; v++) if (row[v] > row[best]) best = v;
  return best;
};

function maxDiff(expected: number[][], got: Float32Array[]): number {
  let max = 0;
  expected.forEach((row, p) => row.forEach((v, i) => (max = Math.max(max, Math.abs(v - got[p][i])))));
  return max;
}

/** Unmerged: a LoRA training stage over the whole model, its frozen base from the folder, its adapters from the PEFT folder. */
function runUnmerged(folder: ModelFolder, config: GptConfig, adapter: PeftAdapter, tokens: readonly number[]): Float32Array[] {
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, lora: adapter.spec });
  try {
    stage.base!.flat.data.set(hfWeights(folder, stage.base!.layout));
    copyByName(adapter.layout, adapter.adapters, stage.layout, stage.params.flat.data);
    stage.training = false;
    const out = stage.forward(new Int32Array(tokens), 1, tokens.length) as Float32Array;
    const V = config.vocabSize;
    return tokens.map((_, p) => out.slice(p * V, (p + 1) * V));
  } finally {
    stage.release();
  }
}

/** Merged at load (or no adapter: a folder already merged), served one token at a time through two stages' KV caches; then greedy tokens. */
function runMerged(folder: ModelFolder, config: GptConfig, adapter: PeftAdapter | null, tokens: readonly number[], steps: number): { logits: Float32Array[]; greedy: number[] } {
  const stages = splitEvenly(config, 2).map((range) => {
    const weights = hfWeights(folder, stageParamLayout(config, range));
    if (!adapter) return new StageInference(engine, config, range, weights, { maxSessions: 1 });
    const adapters = copyByName(adapter.layout, adapter.adapters, loraLayout(config, adapter.spec, range));
    return new StageInference(engine, config, range, weights, { maxSessions: 1, lora: { spec: adapter.spec, adapters } });
  });
  try {
    for (const s of stages) s.join('s');
    const step = (token: number): Float32Array => {
      let x: Int32Array | Float32Array = new Int32Array([token]);
      for (const s of stages) x = s.prefill('s', x);
      return (x as Float32Array).slice();
    };
    const logits = tokens.map(step);
    const greedy: number[] = [];
    let last = logits[logits.length - 1];
    for (let i = 0; i < steps; i++) {
      greedy.push(argmax(last));
      last = step(greedy[i]);
    }
    return { logits, greedy };
  } finally {
    for (const s of stages) s.release();
  }
}

for (const c of LORA_REFERENCE_CASES) {
  test(`${c.name}: base + a PEFT adapter matches PyTorch within 1e-4, unmerged (training forward) and merged (serving over 2 stages), with its 32 greedy tokens`, (t) => {
    const f = fixture(c.name);
    const baseFixture = fixture(c.base.name);
    const dir = join(root, c.base.name), adapterDir = join(root, c.name);
    writeRandomFolder(dir, c.base.hfConfig, { dtype: c.base.dtype, seed: c.base.seed, scale: c.base.scale });
    const folder = ModelFolder.open(dir);
    try {
      const config = gptConfigOfDecoder(folder.config);
      writeRandomAdapter(adapterDir, config, c);
      const adapter = readPeftAdapter(adapterDir, config);
      assert.deepEqual(adapter.spec, c.spec);
      const unmerged = maxDiff(f.logits, runUnmerged(folder, config, adapter, f.tokens));
      const served = runMerged(folder, config, adapter, f.tokens, REFERENCE_GREEDY_STEPS);
      const merged = maxDiff(f.logits, served.logits);
      // the adapter's effect on the logits, so that a no-op adapter cannot pass
      const effect = maxDiff(baseFixture.logits, f.logits.map((row) => Float32Array.from(row)));
      t.diagnostic(`max |Δlogit| unmerged ${unmerged.toExponential(2)}, merged ${merged.toExponential(2)}; the adapter moves the logits by up to ${effect.toFixed(3)}`);
      assert.ok(effect > 0.05, `the adapter changes the reference logits (by ${effect})`);
      assert.ok(unmerged <= 1e-4, `unmerged: max |Δlogit| ${unmerged}`);
      assert.ok(merged <= 1e-4, `merged: max |Δlogit| ${merged}`);
      assert.deepEqual(served.greedy, f.greedy);
      // `nbcli model export --merge`: the base's model file exported with the adapter merged in is a plain folder that serves the same
      const file = join(root, `${c.name}.safetensors`), mergedDir = join(root, `${c.name}-merged`);
      importFolder(dir, file);
      exportModelFile(file, mergedDir, { mergeAdapter: adapterDir, dtype: 'F32' });
      const mergedFolder = ModelFolder.open(mergedDir);
      try {
        const plain = runMerged(mergedFolder, config, null, f.tokens, REFERENCE_GREEDY_STEPS);
        const exported = maxDiff(f.logits, plain.logits);
        t.diagnostic(`exported with --merge: max |Δlogit| ${exported.toExponential(2)}`);
        assert.ok(exported <= 1e-4, `exported merged: max |Δlogit| ${exported}`);
        assert.deepEqual(plain.greedy, f.greedy);
      } finally {
        mergedFolder.close();
      }
    } finally {
      folder.close();
    }
  });
}
