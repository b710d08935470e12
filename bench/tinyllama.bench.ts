// The 1.1B case of issue 34, on real processes (group `models`):
//
//   models.tinyllama.import_s, .import_peak_rss_mb   `nbcli model import
//       --local` of a folder with TinyLlama-1.1B's config.json and random
//       BF16 weights (scripts/write-model-folder.ts, 2 shards): wall time and
//       the command's peak resident memory, beside the largest tensor's f32
//       bytes (target: peak ≤ largest tensor + 512 MB)
//   models.tinyllama.chain4.tokens_per_s   the model published (uploaded in
//       chunks), deployed on 4 stages of 4 miner processes, a streamed chat
//       completion of DECODE tokens through them: tokens after the first, per
//       second (the first token's time is the prompt's prefill through the
//       chain, reported as .first_token_s)
//
// Needs about 14 GB of memory (4 miners holding a quarter of the model each
// in f32, the orchestrator, the file); skipped with the reason when the
// machine has less. The orchestrator runs without spot checks and with a free
// store of 4 GiB (the file is 2.2 GB; its default is 1 GiB). About 5 minutes
// on 2 cores.
import { mkdtempSync, rmSync } from 'node:fs';
import { freemem, tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { generatePrivateKey } from 'viem/accounts';
import { saveWallet } from '../src/chain/wallets.ts';
import { writeShapedFolder } from '../scripts/write-model-folder.ts';
import { Cluster } from '../test/network/helpers.ts';
import type { Bench, BenchResult } from './harness.ts';

const DECODE = 24;
const NEEDS_BYTES = 14 * 2 ** 30;

export const tinyllamaBenches: Bench[] = [
  {
    group: 'models',
    async run(o): Promise<BenchResult[]> {
      if (freemem() < NEEDS_BYTES) {
        o.log(`tinyllama: skipped, ${(freemem() / 2 ** 30).toFixed(1)} GiB free of the ${NEEDS_BYTES / 2 ** 30} GiB it needs`);
        return [];
      }
      const out: BenchResult[] = [];
      const root = mkdtempSync(join(tmpdir(), 'nimble-tinyllama-'));
      const cluster = new Cluster();
      let watch: NodeJS.Timeout | undefined;
      try {
        const folder = join(root, 'tinyllama');
        let t0 = performance.now();
        const bytes = writeShapedFolder(folder, 'tinyllama', { dtype: 'BF16' });
        o.log(`tinyllama: ${(bytes / 1e9).toFixed(2)} GB of BF16 weights written in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
        process.env.NIMBLE_CHAIN_RPC = '';
        process.env.NIMBLE_PASSWORD = 'bench';
        const home = join(cluster.dir, 'orch');
        const file = join(root, 'tinyllama.safetensors');
        const imported = await cluster.nbcli(['model', 'import', folder, '--local', '--out', file], home);
        if (imported.code !== 0) throw new Error(`import failed: ${imported.stderr}`);
        const r = imported.out[0] as { seconds: number; peakRssBytes: number; largestTensorBytes: number; bytes: number; model: string };
        o.log(`tinyllama: imported as ${r.model}: ${(r.bytes / 1e9).toFixed(2)} GB file, largest tensor ${(r.largestTensorBytes / 2 ** 20).toFixed(0)} MB as f32`);
        out.push({ bench: 'models.tinyllama.import_s', value: Number(r.seconds.toFixed(1)), unit: 's' });
        out.push({ bench: 'models.tinyllama.import_peak_rss_mb', value: Math.round(r.peakRssBytes / 2 ** 20), unit: `MB (largest tensor ${Math.round(r.largestTensorBytes / 2 ** 20)} MB as f32; target ≤ it + 512)` });

        await cluster.startOrchestrator(['--min-stake', '0', '--check-rate', '0', '--inference-check-rate', '0', '--free-store', '4GiB'], { chain: true });
        saveWallet(home, 'dev', generatePrivateKey(), 'bench', 'light');
        const miners = ['a', 'b', 'c', 'd'];
        for (const n of miners) saveWallet(home, `w-${n}`, generatePrivateKey(), 'bench', 'light');
        const procs = await Promise.all(miners.map((n) => cluster.startMiner(n, ['--data-dir', home, '--wallet.name', `w-${n}`, '--serve', 'inference'])));
        // what the miners say of the deployment while it loads (a download of gigabytes, then a quarter of the model each)
        watch = setInterval(() => {
          for (const p of procs) for (const l of p.lines.splice(0)) if (l.includes('deployment') || l.includes('error')) o.log(`miner: ${l.slice(0, 240)}`);
        }, 5000);
        const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);
        t0 = performance.now();
        const published = await nbcli('model', 'publish', '--file', file, '--name', 'tinyllama', '--wallet.name', 'dev');
        if (published.code !== 0) {
          for (const l of cluster.orchestrator?.lines.slice(-30) ?? []) o.log(`orchestrator: ${l.slice(0, 300)}`);
          throw new Error(`publish failed: ${published.stderr}`);
        }
        o.log(`tinyllama: published (uploaded in chunks) in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
        t0 = performance.now();
        const deployed = await nbcli('model', 'deploy', 'tinyllama', '--stages', '4', '--wallet.name', 'dev', '--wait', '--timeout', '900');
        if (deployed.code !== 0) throw new Error(`deploy failed: ${deployed.stderr}`);
        o.log(`tinyllama: served on 4 stages of 4 miners after ${((performance.now() - t0) / 1000).toFixed(0)} s`);
        const key = await nbcli('api-key', 'create', '--name', 'bench', '--wallet.name', 'dev');
        if (key.code !== 0) throw new Error(`api-key failed: ${key.stderr}`);
        const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: key.out[0].key as string, maxRetries: 0, timeout: 600_000 });
        const started = performance.now();
        let first = 0;
        let tokens = 0;
        let text = '';
        const stream = await openai.chat.completions.create({
          model: 'tinyllama', messages: [{ role: 'user', content: 'Call me Ishmael.' }], max_tokens: DECODE, temperature: 0, stream: true, stream_options: { include_usage: true },
        });
        for await (const chunk of stream) {
          const piece = chunk.choices[0]?.delta.content;
          if (piece) {
            if (!first) first = performance.now();
            text += piece;
          }
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
        }
        const end = performance.now();
        o.log(`tinyllama: ${tokens} tokens (${JSON.stringify(text.slice(0, 60))}…), first after ${((first - started) / 1000).toFixed(1)} s`);
        out.push({ bench: 'models.tinyllama.chain4.first_token_s', value: Number(((first - started) / 1000).toFixed(2)), unit: 's (prompt prefill through 4 stages)' });
        out.push({ bench: 'models.tinyllama.chain4.tokens_per_s', value: Number(((tokens - 1) / ((end - first) / 1000)).toFixed(2)), unit: 'tokens/s after the first, 4 stages on 4 miners, batch 1' });
        return out;
      } finally {
        clearInterval(watch);
        await cluster.stopGracefully();
        rmSync(root, { recursive: true, force: true });
      }
    },
  },
];
