// Runs in its own process so that peak RSS belongs to training alone.
// argv: mode ('speed' | 'convergence'), steps. Prints one JSON line.
import { Engine } from '../src/engine/engine.ts';
import { loadCorpus } from '../src/data/corpus.ts';
import { gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { splitEvenly } from '../src/model/parts.ts';
import { trainLocal } from '../src/train/local.ts';
import { median } from './harness.ts';

const mode = process.argv[2] ?? 'speed';
const steps = Number(process.argv[3] ?? 40);
const corpus = loadCorpus('moby-dick');
const engine = await Engine.create();
const B = 12;

if (mode === 'speed') {
  const r = trainLocal(engine, { model: 'gpt-tiny', corpus, steps, batchSize: B, evalBatches: 1 });
  const rss = process.resourceUsage().maxRSS / 1024;
  // one middle stage of three
  const config = gptConfig('gpt-tiny');
  const middle = splitEvenly(config, 3)[1];
  const stage = new GptStage(engine, config, middle, { batchSize: B });
  const act = new Float32Array(B * config.contextLength * config.channels).map((_, i) => Math.sin(i));
  const times: number[] = [];
  for (let i = 0; i < 15; i++) {
    const t0 = performance.now();
    stage.zeroGrad();
    stage.forward(act, B, config.contextLength);
    stage.backward(act);
    if (i >= 3) times.push(performance.now() - t0);
  }
  const out = {
    tokensPerSecond: r.tokensPerSecond,
    peakRssMb: rss,
    stage2of3Ms: median(times),
    stage2of3: `[${middle.from}, ${middle.to})`,
    threads: engine.threads,
    relaxedSimd: engine.relaxedSimd,
  };
  process.stdout.write(JSON.stringify(out) + '\n');
} else {
  // the reference recipe: AdamW lr 1e-3, betas 0.9/0.999, weight decay 0.1, no clipping, no schedule
  let last = 0;
  const r = trainLocal(engine, {
    model: 'gpt-tiny', corpus, steps, batchSize: B, evalBatches: 200,
    optimizer: { lr: 1e-3, beta1: 0.9, beta2: 0.999, weightDecay: 0.1, gradClip: 0 },
    onStep: (s) => {
      if (s.step - last >= 250 || s.step === s.steps) {
        last = s.step;
        process.stderr.write(`[convergence] step ${s.step}/${s.steps} loss ${s.loss.toFixed(4)} ${Math.round(s.tokensPerSecond)} tok/s\n`);
      }
    },
  });
  process.stdout.write(JSON.stringify({ heldoutLoss: r.heldoutLoss, tokens: steps * B * 64, tokensPerSecond: r.tokensPerSecond }) + '\n');
}
await engine.close();
