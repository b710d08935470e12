// Honest heartbeats under a flood: the latency of a joined miner's signed
// heartbeats (p99) at rest and while another process floods the orchestrator
// with forged signatures (session and wallet), unsigned POST /runs and
// 100-200 MiB unsigned uploads to signed routes; and how much the
// orchestrator's resident memory grows while only the uploads flood it. The
// orchestrator runs in this process (its RSS is this process's), the flood
// in a child (bench/flood-child.ts).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { generatePrivateKey } from 'viem/accounts';
import { startOrchestrator, type RunningOrchestrator } from '../src/orchestrator/server.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { RequestSigner } from '../src/protocol/signing.ts';
import { rssOf, sampleMax } from '../test/helpers/http-flood.ts';
import type { Bench, BenchResult } from './harness.ts';

const HEARTBEATS = 400;
const MB = 1e6;

/** A miner that joined: signs its heartbeats with its session key. */
export async function joinMiner(orch: RunningOrchestrator): Promise<RequestSigner> {
  const domain = orch.coordinator.identity.domain;
  const wallet = new RequestSigner(generatePrivateKey(), { domain });
  const session = SessionKey.generate();
  const body = new TextEncoder().encode(JSON.stringify({ name: 'bench', url: 'http://127.0.0.1:9', hardware: { gflops: 1, threads: 1, memoryBytes: 1 }, bandwidthMbps: 100, sessionKey: session.publicKey }));
  const res = await fetch(`${orch.url}/miners/join`, { method: 'POST', body, headers: { 'content-type': 'application/json', ...(await wallet.sign('POST', '/miners/join', body)) } });
  if (res.status !== 200) throw new Error(`join: ${res.status} ${await res.text()}`);
  return new RequestSigner({ session, address: wallet.address }, { domain });
}

/** p99 of `n` heartbeats sent one after another, ms (every one must be answered 200). */
async function heartbeatP99(orch: RunningOrchestrator, miner: RequestSigner, n: number): Promise<number> {
  const body = new TextEncoder().encode(JSON.stringify({ freeSlots: 0, queue: 0, reports: [] }));
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const headers = { 'content-type': 'application/json', ...(await miner.sign('POST', '/miners/heartbeat', body)) };
    const t0 = performance.now();
    const res = await fetch(`${orch.url}/miners/heartbeat`, { method: 'POST', body, headers });
    await res.arrayBuffer();
    times.push(performance.now() - t0);
    if (res.status !== 200) throw new Error(`heartbeat answered ${res.status}`);
    await new Promise((r) => setTimeout(r, 5));
  }
  times.sort((a, b) => a - b);
  return times[Math.min(times.length - 1, Math.ceil(0.99 * times.length) - 1)];
}

/** Starts the flood child; resolves once it is under way, with its stop (which resolves with what it sent). */
async function flood(url: string, mode: 'mixed' | 'oversized', victim: string): Promise<() => Promise<Record<string, unknown>>> {
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', new URL('./flood-child.ts', import.meta.url).pathname, url, mode, victim], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout! });
  const events: Record<string, unknown>[] = [];
  let wake: (() => void) | null = null;
  lines.on('line', (line) => {
    events.push(JSON.parse(line) as Record<string, unknown>);
    wake?.();
  });
  const next = async (event: string): Promise<Record<string, unknown>> => {
    for (;;) {
      const found = events.find((e) => e.event === event);
      if (found) return found;
      if (child.exitCode !== null) throw new Error(`flood child exited (${child.exitCode})`);
      await new Promise<void>((r) => (wake = r));
    }
  };
  await next('ready');
  await new Promise((r) => setTimeout(r, 1000)); // under way
  return async () => {
    child.stdin!.end();
    return next('done');
  };
}

export const floodBenches: Bench[] = [
  {
    group: 'flood',
    async run(o): Promise<BenchResult[]> {
      const dir = mkdtempSync(join(tmpdir(), 'nimble-bench-flood-'));
      const orch = await startOrchestrator({ dataDir: join(dir, 'orch') });
      try {
        const miner = await joinMiner(orch);
        await heartbeatP99(orch, miner, 50); // warm-up
        const rest = await heartbeatP99(orch, miner, HEARTBEATS);
        o.log(`heartbeat p99 at rest: ${rest.toFixed(2)} ms; now under a flood of forged signatures, unsigned POST /runs and oversized uploads`);
        let stop = await flood(orch.url, 'mixed', miner.address);
        const flooded = await heartbeatP99(orch, miner, HEARTBEATS);
        const mixed = await stop();
        o.log(`heartbeat p99 under the flood: ${flooded.toFixed(2)} ms; the flood: ${JSON.stringify(mixed)}`);
        o.log('RSS while only 100-200 MiB uploads flood it');
        const before = rssOf(process.pid);
        const rss = sampleMax(() => rssOf(process.pid), 20);
        stop = await flood(orch.url, 'oversized', miner.address);
        await new Promise((r) => setTimeout(r, 10_000));
        const oversized = await stop();
        const peak = rss.stop();
        o.log(`RSS ${(before / MB).toFixed(0)} MB, peak ${(peak / MB).toFixed(0)} MB; uploads offered ${(Number(oversized.offered) / MB).toFixed(0)} MB, ${(Number(oversized.sent) / MB).toFixed(0)} MB sent before the answers (${JSON.stringify(oversized.statuses)})`);
        return [
          { bench: 'flood.heartbeat_p99_ms.rest', value: Number(rest.toFixed(2)), unit: 'ms' },
          { bench: 'flood.heartbeat_p99_ms.flood', value: Number(flooded.toFixed(2)), unit: 'ms' },
          { bench: 'flood.heartbeat_p99_ratio', value: Number((flooded / rest).toFixed(2)), unit: 'ratio' },
          { bench: 'flood.rss_growth_mb', value: Number(((peak - before) / MB).toFixed(1)), unit: 'MB' },
          { bench: 'flood.upload_offered_mb', value: Math.round(Number(oversized.offered) / MB), unit: 'MB' },
        ];
      } finally {
        await orch.close();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  },
];
