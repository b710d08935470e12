// The 124M GPT-2 shape served from one real miner (issue 34, group `models`):
//
//   models.gpt2_124m.miner.decode_tokens_per_s.b1, .b8   a folder of GPT-2
//       124M's config and random BF16 weights (scripts/write-model-folder.ts)
//       imported and published with `nbcli model import`, deployed on 1 stage
//       of one miner process (the engine's threads: every core), then N
//       concurrent `/v1/completions` requests through the orchestrator, each
//       an 8-token prompt (token ids) and DECODE tokens greedy: generated
//       tokens of all N over the wall time from the first request sent to
//       the last answer (the prompts' prefill and HTTP included), median of
//       REPEATS rounds after a warm-up, with .spread ((max − min) / median).
//       Beside models.gpt2_124m.decode_tokens_per_s.* (the same model on one
//       StageInference in the bench's process, ./models.bench.ts), this is
//       what the network's serving path costs on top.
//   models.gpt2_124m.miner.first_token_ms.b1   a streamed request's first token
//
// The orchestrator runs without spot checks (its replays would share the two
// cores with the miner) and with a chain (publishing names the model there).
// About 2 minutes on 2 cores.
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { generatePrivateKey } from 'viem/accounts';
import { saveWallet } from '../src/chain/wallets.ts';
import { mulberry32 } from '../src/model/init.ts';
import { writeShapedFolder } from '../scripts/write-model-folder.ts';
import { Cluster } from '../test/network/helpers.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const PROMPT = 8;
const DECODE = 32;
const REPEATS = 3;
const BATCHES = [1, 8];
const VOCAB = 50257;

export const gpt2MinerBenches: Bench[] = [
  {
    group: 'models',
    async run(o): Promise<BenchResult[]> {
      const out: BenchResult[] = [];
      const root = mkdtempSync(join(tmpdir(), 'nimble-gpt2-miner-'));
      const cluster = new Cluster();
      try {
        const folder = join(root, 'gpt2-124m');
        writeShapedFolder(folder, 'gpt2-124m', { dtype: 'BF16' });
        process.env.NIMBLE_CHAIN_RPC = '';
        process.env.NIMBLE_PASSWORD = 'bench';
        const home = join(cluster.dir, 'orch');
        await cluster.startOrchestrator(['--min-stake', '0', '--check-rate', '0', '--inference-check-rate', '0'], { chain: true });
        saveWallet(home, 'dev', generatePrivateKey(), 'bench', 'light');
        saveWallet(home, 'w-a', generatePrivateKey(), 'bench', 'light');
        await cluster.startMiner('a', ['--data-dir', home, '--wallet.name', 'w-a', '--serve', 'inference', '--threads', String(availableParallelism())]);
        const nbcli = async (...args: string[]): Promise<Record<string, unknown>[]> => {
          const r = await cluster.nbcli([...args, '--orchestrator', cluster.url], home);
          if (r.code !== 0) throw new Error(`nbcli ${args.slice(0, 2).join(' ')} failed: ${r.stderr}`);
          return r.out;
        };
        let t0 = performance.now();
        await nbcli('model', 'import', folder, '--name', 'gpt2-124m', '--wallet.name', 'dev');
        o.log(`gpt2-124m: imported and published in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        t0 = performance.now();
        await nbcli('model', 'deploy', 'gpt2-124m', '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '600');
        o.log(`gpt2-124m: served by one miner after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        const key = (await nbcli('api-key', 'create', '--name', 'bench', '--wallet.name', 'dev'))[0].key as string;
        const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: key, maxRetries: 0, timeout: 600_000 });
        const rand = mulberry32(7);
        const prompt = (): number[] => Array.from({ length: PROMPT }, () => Math.floor(rand() * VOCAB));
        const complete = async (): Promise<number> => {
          const r = await openai.completions.create({ model: 'gpt2-124m', prompt: prompt(), max_tokens: DECODE, temperature: 0 });
          return r.usage?.completion_tokens ?? 0;
        };
        await complete();
        for (const b of BATCHES) {
          const rates: number[] = [];
          let tokens = 0;
          for (let i = 0; i < REPEATS; i++) {
            const started = performance.now();
            const counts = await Promise.all(Array.from({ length: b }, complete));
            const n = counts.reduce((x, y) => x + y, 0);
            tokens += n;
            rates.push(n / ((performance.now() - started) / 1000));
          }
          const m = median(rates);
          o.log(`gpt2-124m miner b${b}: ${rates.map((r) => r.toFixed(1)).join(', ')} tokens/s (${tokens} tokens in ${REPEATS} rounds)`);
          out.push(
            { bench: `models.gpt2_124m.miner.decode_tokens_per_s.b${b}`, value: Number(m.toFixed(2)), unit: `tokens/s, ${b} concurrent /v1/completions through the orchestrator to 1 miner (median of ${REPEATS})` },
            { bench: `models.gpt2_124m.miner.decode_tokens_per_s.b${b}.spread`, value: Number(((Math.max(...rates) - Math.min(...rates)) / m).toFixed(3)), unit: '(max − min) / median' },
          );
        }
        const started = performance.now();
        let first = 0;
        const stream = await openai.completions.create({ model: 'gpt2-124m', prompt: prompt(), max_tokens: 4, temperature: 0, stream: true });
        for await (const chunk of stream) if (!first && chunk.choices[0]?.text) first = performance.now();
        if (!first) throw new Error('the stream sent no text');
        out.push({ bench: 'models.gpt2_124m.miner.first_token_ms.b1', value: Math.round(first - started), unit: `ms (${PROMPT}-token prompt, streamed)` });
        return out;
      } finally {
        await cluster.stopGracefully();
        rmSync(root, { recursive: true, force: true });
      }
    },
  },
];
