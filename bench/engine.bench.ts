// Engine benchmarks: sgemm throughput, gpt-tiny training speed and memory, a
// middle stage's forward + backward time, and (with --convergence) the
// held-out loss of the reference recipe.
import { spawnSync } from 'node:child_process';
import { Type, type Static } from '@sinclair/typebox';
import { Engine } from '../src/engine/engine.ts';
import { parseJson } from '../src/protocol/messages.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

/** The last line a bench child (gpt-child.ts) prints: its figures by name. */
const ChildResult = Type.Record(Type.String(), Type.Union([Type.Number(), Type.String(), Type.Boolean()]));

async function sgemmGflops(threads: number, n: number, repeats: number): Promise<number> {
  const engine = await Engine.create({ threads });
  try {
    const a = engine.tensor([n, n]), b = engine.tensor([n, n]), c = engine.tensor([n, n]);
    for (let i = 0; i < n * n; i++) {
      a.data[i] = Math.sin(i);
      b.data[i] = Math.cos(i);
    }
    const run = (): void => engine.kernels.sgemm({ M: n, N: n, K: n, a: a.ptr, lda: n, b: b.ptr, ldb: n, c: c.ptr, ldc: n });
    run();
    const rates: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const t0 = performance.now();
      run();
      rates.push((2 * n ** 3) / ((performance.now() - t0) * 1e6));
    }
    return median(rates);
  } finally {
    await engine.close();
  }
}

export function gptChild(mode: string, steps: number): Static<typeof ChildResult> {
  const r = spawnSync(process.execPath, ['--import', 'tsx', new URL('./gpt-child.ts', import.meta.url).pathname, mode, String(steps)], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (r.status !== 0) throw new Error(`bench child ${mode} failed (exit ${r.status})`);
  return parseJson(ChildResult, r.stdout.trim().split('\n').pop()!, `bench child ${mode} output`);
}

export const engineBenches: Bench[] = [
  {
    group: 'engine',
    async run(o): Promise<BenchResult[]> {
      o.log('sgemm');
      return [
        { bench: 'engine.sgemm512.t1', value: await sgemmGflops(1, 512, 15), unit: 'GFLOP/s' },
        { bench: 'engine.sgemm512.tall', value: await sgemmGflops(0, 512, 15), unit: 'GFLOP/s' },
        { bench: 'engine.sgemm1024.tall', value: await sgemmGflops(0, 1024, 7), unit: 'GFLOP/s' },
      ];
    },
  },
  {
    group: 'gpt-tiny',
    async run(o): Promise<BenchResult[]> {
      o.log('training 40 steps of gpt-tiny (batch 12, context 64) in a child process');
      const r = gptChild('speed', 40);
      o.log(`threads ${r.threads}, relaxed SIMD ${r.relaxedSimd}, middle stage ${r.stage2of3}`);
      return [
        { bench: 'gpt-tiny.train.tokens_per_s', value: Math.round(r.tokensPerSecond as number), unit: 'tokens/s' },
        { bench: 'gpt-tiny.stage2of3.fwd_bwd_ms', value: r.stage2of3Ms as number, unit: 'ms' },
        { bench: 'gpt-tiny.train.peak_rss_mb', value: Math.round(r.peakRssMb as number), unit: 'MB' },
      ];
    },
  },
  {
    group: 'gpt-tiny-convergence',
    convergence: true,
    async run(o): Promise<BenchResult[]> {
      o.log('reference recipe: 2,000 steps x 12 x 64 = 1.536 M tokens, held-out loss over 200 batches');
      const r = gptChild('convergence', 2000);
      return [{ bench: 'gpt-tiny.heldout_loss', value: r.heldoutLoss as number, unit: 'nats/byte' }];
    },
  },
];
