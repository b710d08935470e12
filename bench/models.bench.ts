// Real-model benchmarks (issue 34), one process, the engine's threads (every
// core, as the rest of bench/):
//
//   models.max_abs_logit_diff   the engine against the committed PyTorch
//       fixtures (test/fixtures/hf-reference/, the cases of
//       test/helpers/hf-reference.ts: Llama, Llama 3 rope scaling, Qwen2,
//       GPT-2; F32 and BF16), every position's logits through the KV cache
//       of one StageInference, max over all cases
//   models.gpt2_124m.*   a GPT-2-shaped model of 124 M parameters (random
//       BF16 weights from scripts/write-model-folder.ts, in a temp folder,
//       widened to f32 on load) on one StageInference holding the whole
//       model, what one miner runs:
//     decode_tokens_per_s.b1, .b8   KV-cached greedy decoding of 1 and 8
//         sessions: DECODE_STEPS steps after an 8-token prompt, median of
//         REPEATS runs (after one warm-up), with .spread ((max − min) / median)
//     prefill_ms.t512   prefill of a 512-token prompt into a new session
//     torch_*, vs_torch.*   the same on PyTorch in the same run (scripts/hf_reference.py
//         bench: the same folder, float32, KV cache, torch threads = the
//         engine's, OMP_WAIT_POLICY=PASSIVE), when a python with torch exists; vs_torch = ours / PyTorch's
//         tokens/s (or PyTorch's ms / ours). Target: ≥ 1.0× at batch 8.
//
// About 3 minutes on 2 idle cores (twice that on a loaded machine: PyTorch at batch 8 is the longest part).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine } from '../src/engine/engine.ts';
import { StageInference, stageParamLayout } from '../src/inference/stage-inference.ts';
import { gptConfigOfDecoder } from '../src/model/hf/decoder-config.ts';
import type { GptConfig } from '../src/model/config.ts';
import { hfWeights } from '../src/model/hf/hf-weights.ts';
import { ModelFolder } from '../src/model/hf/model-folder.ts';
import { partCount } from '../src/model/parts.ts';
import { mulberry32 } from '../src/model/init.ts';
import { writeRandomFolder } from '../test/helpers/hf-folder.ts';
import { REFERENCE_CASES } from '../test/helpers/hf-reference.ts';
import { writeShapedFolder } from '../scripts/write-model-folder.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const PROMPT = 8;
const DECODE_STEPS = 16;
const REPEATS = 5;
const PREFILL = 512;
const PREFILL_REPEATS = 3;
const BATCHES = [1, 8];

interface Fixture {
  tokens: number[];
  logits: number[][];
}

function argmaxRows(logits: Float32Array, V: number, out: Int32Array): void {
  for (let b = 0; b < out.length; b++) {
    let best = 0;
    const o = b * V;
    for (let v = 1; v < V; v++) if (logits[o + v] > logits[o + best]) best = v;
    out[b] = best;
  }
}

/** Max |Δlogit| of the engine against every committed PyTorch fixture, one token at a time through the cache. */
function referenceDiff(engine: Engine, root: string, log: (line: string) => void): number {
  let max = 0;
  for (const c of REFERENCE_CASES) {
    const f = JSON.parse(readFileSync(new URL(`../test/fixtures/hf-reference/${c.name}.json`, import.meta.url), 'utf8')) as Fixture;
    const dir = join(root, c.name);
    writeRandomFolder(dir, c.hfConfig, { dtype: c.dtype, seed: c.seed, scale: c.scale });
    const folder = ModelFolder.open(dir);
    try {
      const config = gptConfigOfDecoder(folder.config);
      const range = { from: 0, to: partCount(config) };
      const inf = new StageInference(engine, config, range, hfWeights(folder, stageParamLayout(config, range)), { maxSessions: 1 });
      try {
        inf.join('s');
        let diff = 0;
        f.tokens.forEach((tok, p) => {
          const logits = inf.prefill('s', new Int32Array([tok]));
          f.logits[p].forEach((v, i) => (diff = Math.max(diff, Math.abs(v - logits[i]))));
        });
        log(`${c.name}: max |Δlogit| ${diff.toExponential(2)} over ${f.tokens.length} positions`);
        max = Math.max(max, diff);
      } finally {
        inf.release();
      }
    } finally {
      folder.close();
    }
  }
  return max;
}

/** Tokens/s of `batch` sessions decoding greedily DECODE_STEPS steps after a PROMPT-token prompt: each repeat's figure. */
function decodeRates(inf: StageInference, config: GptConfig, batch: number): number[] {
  const V = config.vocabSize;
  const rates: number[] = [];
  for (let r = 0; r < REPEATS + 1; r++) {
    const rng = mulberry32(1000 * batch + r);
    const ids = Array.from({ length: batch }, (_, i) => `s${i}`);
    const next = new Int32Array(batch);
    ids.forEach((id, i) => {
      inf.join(id);
      const logits = inf.prefill(id, Int32Array.from({ length: PROMPT }, () => Math.floor(rng() * V)));
      argmaxRows(logits, V, next.subarray(i, i + 1));
    });
    const t0 = performance.now();
    for (let t = 0; t < DECODE_STEPS; t++) {
      const logits = inf.decode(ids.map((id, i) => ({ session: id, input: next.subarray(i, i + 1) })));
      argmaxRows(logits, V, next);
    }
    const ms = performance.now() - t0;
    for (const id of ids) inf.leave(id);
    if (r > 0) rates.push((batch * DECODE_STEPS * 1000) / ms); // the first run warms up
  }
  return rates;
}

/** Ms of each prefill of a PREFILL-token prompt into a new session (after one warm-up). */
function prefillTimes(inf: StageInference, config: GptConfig): number[] {
  const times: number[] = [];
  for (let r = 0; r < PREFILL_REPEATS + 1; r++) {
    const rng = mulberry32(77 + r);
    const prompt = Int32Array.from({ length: PREFILL }, () => Math.floor(rng() * config.vocabSize));
    inf.join('p');
    const t0 = performance.now();
    inf.prefill('p', prompt);
    const ms = performance.now() - t0;
    inf.leave('p');
    if (r > 0) times.push(ms);
  }
  return times;
}

/** The first python with torch: $NIMBLE_PYTHON, python3 on the PATH, Debian's /usr/bin/python3; null when none. */
function pythonWithTorch(): string | null {
  for (const py of [process.env.NIMBLE_PYTHON, 'python3', '/usr/bin/python3']) {
    if (!py) continue;
    try {
      execFileSync(py, ['-c', 'import torch'], { stdio: 'ignore' });
      return py;
    } catch {
      // not this one
    }
  }
  return null;
}

interface TorchBench {
  torch: string;
  threads: number;
  decode: Record<string, number[]>;
  prefill_ms: number[];
}

const spread = (xs: readonly number[]): number => (Math.max(...xs) - Math.min(...xs)) / median(xs);
const fmt = (xs: readonly number[], digits = 1): string => `median ${median(xs).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)})`;

export const modelsBenches: Bench[] = [
  {
    group: 'models',
    async run(o): Promise<BenchResult[]> {
      const out: BenchResult[] = [];
      const root = mkdtempSync(join(tmpdir(), 'nimble-models-bench-'));
      const engine = await Engine.create();
      try {
        o.log(`${engine.threads} threads${engine.relaxedSimd ? ', relaxed SIMD' : ''}`);
        const diff = referenceDiff(engine, root, o.log);
        out.push({ bench: 'models.max_abs_logit_diff', value: Number(diff.toExponential(3)), unit: `max |Δlogit| vs PyTorch over ${REFERENCE_CASES.length} fixtures` });

        const dir = join(root, 'gpt2-124m');
        let t0 = performance.now();
        const bytes = writeShapedFolder(dir, 'gpt2-124m', { dtype: 'BF16' });
        o.log(`gpt2-124m: ${(bytes / 1e6).toFixed(0)} MB of BF16 random weights written in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        t0 = performance.now();
        const folder = ModelFolder.open(dir);
        const config = gptConfigOfDecoder(folder.config);
        const range = { from: 0, to: partCount(config) };
        const weights = hfWeights(folder, stageParamLayout(config, range));
        folder.close();
        const inf = new StageInference(engine, config, range, weights, { maxSessions: Math.max(...BATCHES), maxRows: PREFILL });
        o.log(`loaded ${weights.length} parameters (f32) onto one stage in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        const ours: Record<string, number[]> = {};
        try {
          for (const b of BATCHES) {
            ours[`b${b}`] = decodeRates(inf, config, b);
            o.log(`engine decode b${b}: ${fmt(ours[`b${b}`])} tokens/s over ${REPEATS} runs of ${DECODE_STEPS} steps`);
          }
          ours.prefill = prefillTimes(inf, config);
          o.log(`engine prefill of ${PREFILL} tokens: ${fmt(ours.prefill, 0)} ms`);
        } finally {
          inf.release();
        }

        const python = pythonWithTorch();
        let torch: TorchBench | null = null;
        if (python) {
          const script = new URL('../scripts/hf_reference.py', import.meta.url).pathname;
          const args = [script, 'bench', dir, '--batches', BATCHES.join(','), '--prompt', String(PROMPT), '--steps', String(DECODE_STEPS), '--repeats', String(REPEATS), '--prefill', String(PREFILL), '--prefill-repeats', String(PREFILL_REPEATS), '--threads', String(engine.threads)];
          // torch's OpenMP threads spin after each op by default and starve OpenBLAS's own threads (batch 8 ran 4 to 10 times slower here): passive waits
          const env = { ...process.env, OMP_WAIT_POLICY: 'PASSIVE', OPENBLAS_NUM_THREADS: String(engine.threads) };
          torch = JSON.parse(execFileSync(python, args, { encoding: 'utf8', env, maxBuffer: 1 << 24, timeout: 600_000 })) as TorchBench;
          o.log(`PyTorch ${torch.torch} (${python}), ${torch.threads} threads, float32:`);
          for (const b of BATCHES) o.log(`  decode b${b}: ${fmt(torch.decode[`b${b}`])} tokens/s`);
          o.log(`  prefill of ${PREFILL} tokens: ${fmt(torch.prefill_ms, 0)} ms`);
        } else {
          o.log('no python with torch (apt-get install -y python3-torch, or NIMBLE_PYTHON): PyTorch figures skipped');
        }

        for (const b of BATCHES) {
          const r = ours[`b${b}`];
          out.push(
            { bench: `models.gpt2_124m.decode_tokens_per_s.b${b}`, value: Number(median(r).toFixed(2)), unit: `tokens/s (median of ${REPEATS})` },
            { bench: `models.gpt2_124m.decode_tokens_per_s.b${b}.spread`, value: Number(spread(r).toFixed(3)), unit: '(max − min) / median' },
          );
          if (torch) {
            const t = torch.decode[`b${b}`];
            out.push(
              { bench: `models.gpt2_124m.torch_decode_tokens_per_s.b${b}`, value: Number(median(t).toFixed(2)), unit: `tokens/s (median of ${REPEATS})` },
              { bench: `models.gpt2_124m.vs_torch.decode.b${b}`, value: Number((median(r) / median(t)).toFixed(3)), unit: b === 8 ? '× PyTorch (target ≥ 1.0)' : '× PyTorch' },
            );
          }
        }
        out.push({ bench: `models.gpt2_124m.prefill_ms.t${PREFILL}`, value: Math.round(median(ours.prefill)), unit: `ms (median of ${PREFILL_REPEATS})` });
        if (torch) {
          out.push(
            { bench: `models.gpt2_124m.torch_prefill_ms.t${PREFILL}`, value: Math.round(median(torch.prefill_ms)), unit: `ms (median of ${PREFILL_REPEATS})` },
            { bench: `models.gpt2_124m.vs_torch.prefill.t${PREFILL}`, value: Number((median(torch.prefill_ms) / median(ours.prefill)).toFixed(3)), unit: '× PyTorch (its ms / ours)' },
          );
        }
        return out;
      } finally {
        await engine.close();
        rmSync(root, { recursive: true, force: true });
      }
    },
  },
];
