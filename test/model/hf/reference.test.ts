// The engine against an independent PyTorch implementation
// (scripts/hf_reference.py, fixtures in test/fixtures/hf-reference/): the
// random-weight folders the fixtures were made from are made again here
// (fixed seeds), read into the engine (src/model/hf/hf-weights.ts), and every
// position's logits must be within 1e-4 of PyTorch's, with the same 32 greedy
// tokens: through the serving path (one token at a time over the KV cache,
// the model cut into two stages) and through the training path (GptStage's
// forward over the whole prompt).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { gptConfigOfDecoder } from '../../../src/model/hf/decoder-config.ts';
import type { GptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { hfWeights } from '../../../src/model/hf/hf-weights.ts';
import { ModelFolder } from '../../../src/model/hf/model-folder.ts';
import { partCount, splitEvenly } from '../../../src/model/parts.ts';
import { StageInference, stageParamLayout } from '../../../src/inference/stage-inference.ts';
import { writeRandomFolder } from '../../helpers/hf-folder.ts';
import { REFERENCE_CASES, REFERENCE_GREEDY_STEPS, type ReferenceCase } from '../../helpers/hf-reference.ts';

interface Fixture {
  tokens: number[];
  greedy: number[];
  logits: number[][];
}

const root = mkdtempSync(join(tmpdir(), 'nimble-hf-ref-'));
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(() => {
  engine?.close();
  rmSync(root, { recursive: true, force: true });
});

const fixture = (name: string): Fixture => JSON.parse(readFileSync(new URL(`../../fixtures/hf-reference/${name}.json`, import.meta.url), 'utf8')) as Fixture;

function openCase(c: ReferenceCase): ModelFolder {
  const dir = join(root, c.name);
  writeRandomFolder(dir, c.hfConfig, { dtype: c.dtype, seed: c.seed, scale: c.scale });
  return ModelFolder.open(dir);
}

const argmax = (row: Float32Array): number => {
  let best = 0;
  for (let v = 1; v < row.length; v++) if (row[v] > row[best]) best = v;
  return best;
};

/** Every position's logits (one token at a time through two stages' KV caches), then greedy tokens. */
function runServing(folder: ModelFolder, config: GptConfig, tokens: readonly number[], steps: number): { logits: Float32Array[]; greedy: number[] } {
  const stages = splitEvenly(config, 2).map((range) => new StageInference(engine, config, range, hfWeights(folder, stageParamLayout(config, range)), { maxSessions: 1 }));
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

/** Every position's logits of the whole prompt in one forward of the training path. */
function runTraining(folder: ModelFolder, config: GptConfig, tokens: readonly number[]): Float32Array[] {
  const range = { from: 0, to: partCount(config) };
  const stage = new GptStage(engine, config, range, { batchSize: 1 });
  try {
    stage.params.flat.data.set(hfWeights(folder, stage.layout));
    const out = stage.forward(new Int32Array(tokens), 1, tokens.length) as Float32Array;
    const V = config.vocabSize;
    return tokens.map((_, p) => out.slice(p * V, (p + 1) * V));
  } finally {
    stage.release();
  }
}

function maxDiff(expected: number[][], got: Float32Array[]): number {
  let max = 0;
  expected.forEach((row, p) => row.forEach((v, i) => (max = Math.max(max, Math.abs(v - got[p][i])))));
  return max;
}

for (const c of REFERENCE_CASES) {
  test(`${c.name}: the engine matches PyTorch within 1e-4 on every position (serving over 2 stages, and training's forward), and its 32 greedy tokens`, (t) => {
    const f = fixture(c.name);
    const folder = openCase(c);
    try {
      const config = gptConfigOfDecoder(folder.config);
      const served = runServing(folder, config, f.tokens, REFERENCE_GREEDY_STEPS);
      const serving = maxDiff(f.logits, served.logits);
      const training = maxDiff(f.logits, runTraining(folder, config, f.tokens));
      t.diagnostic(`max |Δlogit| serving ${serving.toExponential(2)}, training ${training.toExponential(2)}`);
      assert.ok(serving <= 1e-4, `serving: max |Δlogit| ${serving}`);
      assert.ok(training <= 1e-4, `training: max |Δlogit| ${training}`);
      assert.deepEqual(served.greedy, f.greedy);
    } finally {
      folder.close();
    }
  });
}
