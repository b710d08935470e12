// The dashboard's figures (docs/dashboard.md): dashboard.first_paint_ms, from
// navigating to the page to its network table holding all 20 miners (the
// page loaded, the event stream opened, its first sections drawn), median of
// 5 cold loads (a new page each, the cache disabled) in headless
// Chromium on an in-process orchestrator whose 20 miners are registered
// through its miner store (no processes: this measures the page, not the
// miners); and dashboard.bundle_kb, the gzipped JavaScript of the build.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import chromium from '@sparticuz/chromium';
import pw from 'playwright-core';
import { privateKeyToAddress, generatePrivateKey } from 'viem/accounts';
import { startOrchestrator } from '../src/orchestrator/server.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const WEB = new URL('../dist/web', import.meta.url).pathname;
const MINERS = 20;
const LOADS = 5;

async function run(log: (line: string) => void): Promise<BenchResult[]> {
  const assets = join(WEB, 'assets');
  const js = readdirSync(assets).filter((f) => f.endsWith('.js'));
  if (js.length === 0) throw new Error('the dashboard is not built: npm run build:web');
  const bundle = js.reduce((a, f) => a + gzipSync(readFileSync(join(assets, f)), { level: 9 }).length, 0);

  const dir = mkdtempSync(join(tmpdir(), 'nimble-bench-dash-'));
  const orch = await startOrchestrator({ dataDir: dir, port: 0, coordinator: { minerTimeoutMs: 600_000 } });
  const browser = await pw.chromium.launch({ executablePath: await chromium.executablePath(), args: chromium.args, headless: true });
  try {
    const now = Date.now();
    for (let i = 0; i < MINERS; i++) {
      const id = privateKeyToAddress(generatePrivateKey());
      orch.coordinator.state.miners.upsert({ id, name: `miner-${i + 1}`, url: `http://127.0.0.1:${20_000 + i}`, gflops: 20 + i, threads: 4, memoryBytes: 8 << 30, bandwidthMbps: 1000, sessionKey: SessionKey.generate().publicKey }, now);
    }
    const times: number[] = [];
    // one context (the packaged Chromium runs in a single process, where a closed context can take the browser with it)
    const context = await browser.newContext({ locale: 'en-US' });
    for (let i = 0; i < LOADS; i++) {
      const page = await context.newPage();
      // cold: nothing from the cache
      await (await context.newCDPSession(page)).send('Network.setCacheDisabled', { cacheDisabled: true });
      const t0 = performance.now();
      await page.goto(`${orch.url}/`);
      await page.waitForFunction((n) => document.querySelectorAll('#miners [data-miner]').length === n, MINERS, { timeout: 30_000 });
      times.push(performance.now() - t0);
      await page.close();
    }
    await context.close();
    log(`first paint of ${MINERS} miners: ${times.map((t) => t.toFixed(0)).join(', ')} ms; bundle ${(bundle / 1024).toFixed(1)} KB gzipped (${js.length} file${js.length > 1 ? 's' : ''})`);
    return [
      { bench: 'dashboard.first_paint_ms', value: Math.round(median(times)), unit: 'ms' },
      { bench: 'dashboard.bundle_kb', value: Number((bundle / 1024).toFixed(1)), unit: 'KB' },
    ];
  } finally {
    await browser.close();
    await orch.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export const dashboardBenches: Bench[] = [{ group: 'dashboard', run: ({ log }) => run(log) }];
