// The dashboard's figures (docs/dashboard.md): dashboard.first_paint_ms, from
// navigating to the page to its network table holding all 20 miners (the
// page loaded, the event stream opened, its first sections drawn), median of
// 5 cold loads (a new page each, the cache disabled) in headless
// Chromium on an in-process orchestrator whose 20 miners are registered
// through its miner store (no processes: this measures the page, not the
// miners); and dashboard.bundle_kb, the gzipped JavaScript of the build.
// Responsiveness at the sizes, on the same orchestrator:
// dashboard.network_100_ms, the same load with 100 miners, and
// dashboard.loss_10k_ms, from navigating to a run's page to its chart holding
// 10,000 loss points (the curve as the orchestrator keeps it at most).
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import chromium from '@sparticuz/chromium';
import { chromiumExecutablePath } from '../src/engine/webgpu/chromium-unpack.ts';
import pw from 'playwright-core';
import { privateKeyToAddress, generatePrivateKey } from 'viem/accounts';
import { startOrchestrator } from '../src/orchestrator/server.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const WEB = new URL('../dist/web', import.meta.url).pathname;
const MINERS = 20;
const MANY_MINERS = 100;
const POINTS = 10_000;
const LOADS = 5;

async function run(log: (line: string) => void): Promise<BenchResult[]> {
  const assets = join(WEB, 'assets');
  const js = readdirSync(assets).filter((f) => f.endsWith('.js'));
  if (js.length === 0) throw new Error('the dashboard is not built: npm run build:web');
  const bundle = js.reduce((a, f) => a + gzipSync(readFileSync(join(assets, f)), { level: 9 }).length, 0);

  const dir = mkdtempSync(join(tmpdir(), 'nimble-bench-dash-'));
  const orch = await startOrchestrator({ dataDir: dir, port: 0, coordinator: { minerTimeoutMs: 600_000 } });
  const browser = await pw.chromium.launch({ executablePath: await chromiumExecutablePath(chromium), args: chromium.args, headless: true });
  try {
    const now = Date.now();
    const addMiners = (from: number, to: number): void => {
      for (let i = from; i < to; i++) {
        const id = privateKeyToAddress(generatePrivateKey());
        orch.coordinator.state.miners.upsert({ id, name: `miner-${i + 1}`, url: `http://127.0.0.1:${20_000 + i}`, gflops: 20 + i, threads: 4, memoryBytes: 8 << 30, bandwidthMbps: 1000, sessionKey: SessionKey.generate().publicKey }, now);
      }
    };
    // one context (the packaged Chromium runs in a single process, where a closed context can take the browser with it)
    const context = await browser.newContext({ locale: 'en-US' });
    /** ms from navigating to `path` (cold) to `ready` holding, for each of LOADS loads */
    const loads = async (path: string, ready: string, arg: number): Promise<number[]> => {
      const out: number[] = [];
      for (let i = 0; i < LOADS; i++) {
        const page = await context.newPage();
        // cold: nothing from the cache
        await (await context.newCDPSession(page)).send('Network.setCacheDisabled', { cacheDisabled: true });
        const t0 = performance.now();
        await page.goto(`${orch.url}${path}`);
        await page.waitForFunction(ready, arg, { timeout: 60_000 });
        out.push(performance.now() - t0);
        await page.close();
      }
      return out;
    };
    const tableOf = '(n) => document.querySelectorAll("#miners [data-miner]").length === n';
    addMiners(0, MINERS);
    const times = await loads('/', tableOf, MINERS);
    addMiners(MINERS, MANY_MINERS);
    const many = await loads('/', tableOf, MANY_MINERS);
    // a run with a curve of POINTS points, as the orchestrator records them
    const run = orch.coordinator.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 100_000, stages: 1, minMiners: 1 }, privateKeyToAddress(generatePrivateKey()));
    for (let step = 1; step <= POINTS; step++) orch.dashboard!.losses.record(`run:${run.id}`, step, 5 * Math.exp(-step / 3000) + 1.5, 1000 + (step % 97), now + step);
    const curve = await loads(`/#/runs/${run.id}`, '(n) => Number(document.querySelector("#chart")?.dataset.points ?? 0) >= n', POINTS);
    orch.coordinator.stopRun(run.id, 'the bench is done');
    await context.close();
    log(`${MANY_MINERS} miners: ${many.map((t) => t.toFixed(0)).join(', ')} ms; a run's page with ${POINTS.toLocaleString('en-US')} loss points: ${curve.map((t) => t.toFixed(0)).join(', ')} ms`);
    log(`first paint of ${MINERS} miners: ${times.map((t) => t.toFixed(0)).join(', ')} ms; bundle ${(bundle / 1024).toFixed(1)} KB gzipped (${js.length} file${js.length > 1 ? 's' : ''})`);
    return [
      { bench: 'dashboard.first_paint_ms', value: Math.round(median(times)), unit: 'ms' },
      { bench: 'dashboard.bundle_kb', value: Number((bundle / 1024).toFixed(1)), unit: 'KB' },
      { bench: 'dashboard.network_100_ms', value: Math.round(median(many)), unit: 'ms' },
      { bench: 'dashboard.loss_10k_ms', value: Math.round(median(curve)), unit: 'ms' },
    ];
  } finally {
    await browser.close();
    await orch.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export const dashboardBenches: Bench[] = [{ group: 'dashboard', run: ({ log }) => run(log) }];
