// The engine against an independent PyTorch implementation
// (scripts/hf_reference.py, fixtures in test/fixtures/hf-reference/): the
// random-weight folders the fixtures were made from are made again here
// (fixed seeds), read into the engine, and every position's logits must be
// within 1e-4 of PyTorch's, with the same 32 greedy tokens.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { partCount } from '../../../src/model/gpt.ts';
import { gpt2Weights, gptConfigOfGpt2 } from '../../../src/model/hf/gpt2-weights.ts';
import { ModelFolder } from '../../../src/model/hf/model-folder.ts';
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

/** Every position's logits (one token at a time through the KV cache), then greedy tokens. */
function runGpt2(c: ReferenceCase, tokens: readonly number[], steps: number): { logits: Float32Array[]; greedy: number[] } {
  const dir = join(root, c.name);
  writeRandomFolder(dir, c.hfConfig, { dtype: c.dtype, seed: c.seed, scale: c.scale });
  const folder = ModelFolder.open(dir);
  try {
    const config = gptConfigOfGpt2(folder.config);
    const range = { from: 0, to: partCount(config) };
    const stage = new StageInference(engine, config, range, gpt2Weights(folder, stageParamLayout(config, range)), { maxSessions: 1 });
    try {
      stage.join('s');
      const logits: Float32Array[] = [];
      const step = (token: number): Float32Array => stage.prefill('s', new Int32Array([token])).slice();
      for (const t of tokens) logits.push(step(t));
      const greedy: number[] = [];
      let last = logits[logits.length - 1];
      for (let i = 0; i < steps; i++) {
        let best = 0;
        for (let v = 1; v < last.length; v++) if (last[v] > last[best]) best = v;
        greedy.push(best);
        last = step(best);
      }
      return { logits, greedy };
    } finally {
      stage.release();
    }
  } finally {
    folder.close();
  }
}

for (const c of REFERENCE_CASES.filter((x) => x.name.startsWith('gpt2'))) {
  test(`${c.name}: the engine's GPT matches PyTorch within 1e-4 on every position, and its 32 greedy tokens`, (t) => {
    const f = fixture(c.name);
    const { logits, greedy } = runGpt2(c, f.tokens, REFERENCE_GREEDY_STEPS);
    let max = 0;
    f.logits.forEach((row, p) => row.forEach((v, i) => (max = Math.max(max, Math.abs(v - logits[p][i])))));
    t.diagnostic(`max |Δlogit| ${max.toExponential(2)}`);
    assert.ok(max <= 1e-4, `max |Δlogit| ${max}`);
    assert.deepEqual(greedy, f.greedy);
  });
}
