// The dashboard in a real browser (headless Chromium from npm, driven by
// playwright-core) on a real local network: an orchestrator and two miner
// processes, one named with a script injection. The miners appear, a short
// gpt-micro run's loss points arrive in the chart and it reaches completed,
// the injected name stays text, and cancelling is refused without the
// operator's login cookie and works with it; as the operator, a job's
// Upgrade button moves it onto a group of the miners alive. With NIMBLE_SCREENSHOTS=1 it
// saves a screenshot of each page under docs/images/ (the README's); without,
// it still takes them (a page that cannot render fails) and keeps them in
// memory, so a test run never rewrites files of the repository.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import chromium from '@sparticuz/chromium';
import { chromiumExecutablePath } from '../../src/engine/webgpu/chromium-unpack.ts';
import pw, { type Browser, type Page } from 'playwright-core';
import { zeroAddress } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobEvent, JobView } from '../../src/api/jobs.ts';
import type { JobPlan } from '../../src/jobs/plan-schema.ts';
import { Cluster } from '../network/helpers.ts';

const root = new URL('../..', import.meta.url).pathname;
const IMAGES = join(root, 'docs/images');
/** Takes a screenshot of `page`, written to docs/images/NAME only when asked (NIMBLE_SCREENSHOTS=1). */
const shoot = (page: { screenshot(o: { path?: string; fullPage: boolean }): Promise<Buffer> }, name: string): Promise<Buffer> =>
  page.screenshot({ fullPage: true, ...(process.env.NIMBLE_SCREENSHOTS === '1' ? { path: join(IMAGES, name) } : {}) });
const EVIL = '<img src=x onerror=alert(1)>';

const cluster = new Cluster();
let browser: Browser | null = null;

before(async () => {
  // `npm ci` builds the page; a checkout that has not is built here
  if (!existsSync(join(root, 'dist/web/index.html'))) {
    const r = spawnSync(process.execPath, [join(root, 'node_modules/vite/bin/vite.js'), 'build', '--config', 'web/vite.config.ts'], { cwd: root, stdio: 'inherit' });
    assert.equal(r.status, 0, 'the dashboard builds');
  }
  mkdirSync(IMAGES, { recursive: true });
});

after(async () => {
  await browser?.close();
  await cluster.stop();
});

/** The status badge of the run page shows `status`. */
async function waitStatus(page: Page, status: string, timeout: number): Promise<void> {
  await page.waitForFunction((s) => document.querySelector('#status .badge')?.textContent === s, status, { timeout });
}

test('the dashboard shows the network live, draws the loss, renders miner names as text, and cancels, upgrades and submits only as the operator', async () => {
  const launching = chromiumExecutablePath(chromium).then((executablePath) => pw.chromium.launch({ executablePath, args: chromium.args, headless: true }));
  await cluster.startOrchestrator();
  const listening = await cluster.orchestrator!.waitFor((v) => v.event === 'listening');
  const login = String(listening.login);
  assert.match(login, /^http:\/\/127\.0\.0\.1:\d+\/login\?token=[A-Za-z0-9_-]{43}$/);
  assert.equal(listening.dashboard, `${cluster.url}/`);
  const [b] = await Promise.all([launching, cluster.startMiner('alpha'), cluster.startMiner(EVIL)]);
  browser = b;
  // the language this headless Chromium reports on a POSIX locale, which its own Intl refuses (web/src/intl-guard.ts)
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, locale: 'en-US@posix' });
  const page = await context.newPage();
  const dialogs: string[] = [];
  page.on('dialog', (d) => {
    dialogs.push(d.message());
    void d.dismiss();
  });
  const requests: string[] = [];
  page.on('request', (r) => requests.push(r.url()));
  const errors: string[] = [];
  page.on('console', (m) => void (m.type() === 'error' && errors.push(m.text())));
  page.on('pageerror', (e) => errors.push(e.message));

  // the network: both miners appear (from the event stream), the injected name as plain text
  await page.goto(`${cluster.url}/`);
  await page.waitForFunction(() => document.querySelectorAll('#miners [data-miner]').length === 2, null, { timeout: 10_000 }).catch(async (err: Error) => {
    throw new Error(`${err.message}\npage errors: ${errors.join('\n')}\npage: ${await page.textContent('body')}`);
  });
  const names = await page.$$eval('#miners [data-miner]', (els) => els.map((e) => e.textContent));
  assert.deepEqual([...names].sort(), [EVIL, 'alpha'].sort());
  assert.equal(await page.$$eval('img', (els) => els.length), 0, 'no element was made from a miner name');
  // where each one's GPT stages run: both on wasm (the default), no GPU adapter to name
  assert.deepEqual(await page.$$eval('#miners [data-backend]', (els) => els.map((e) => e.textContent)), ['wasm', 'wasm']);
  assert.equal(await page.textContent('#who'), 'read-only');

  // a short run: loss points arrive in the chart, the run reaches completed
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 40, stages: 2, mergeEvery: 10, batchSize: 8, lr: 0.003, minMiners: 2 });
  await page.goto(`${cluster.url}/#/runs/${run.id}`);
  await page.waitForFunction(() => Number((document.querySelector('#chart') as HTMLElement | null)?.dataset.points ?? 0) >= 3, null, { timeout: 25_000 });
  // its merge rounds as they happen (every 10 steps; one replica per stage, so each settles as 'single'), each stage's named miner
  await page.waitForSelector('#merges [data-outcome]', { timeout: 25_000 });
  const merges = await page.$$eval('#merges tbody tr', (trs) => trs.map((tr) => ({ round: Number(tr.querySelector('[data-round]')?.getAttribute('data-round')), outcome: tr.querySelector('[data-outcome]')?.getAttribute('data-outcome'), replicas: tr.querySelector('[data-replicas]')?.textContent })));
  assert.ok(merges.length >= 1 && merges.every((m) => m.round >= 1 && ['single', 'pending'].includes(String(m.outcome)) && [EVIL, 'alpha'].includes(String(m.replicas))), JSON.stringify(merges));
  const listed = await cluster.api.runMerges(run.id);
  assert.ok(listed.rounds.length >= 1 && listed.rounds.every((r) => r.partitions === 0 && r.replicas.length === 1), JSON.stringify(listed.rounds));
  await shoot(page, 'dashboard-run.png').catch(() => {});
  await waitStatus(page, 'completed', 30_000);
  const points = Number(await page.$eval('#chart', (e) => (e as HTMLElement).dataset.points));
  assert.ok(points >= 3, `${points} loss points drawn`);
  assert.match((await page.textContent('#timeline')) ?? '', /completed/);
  // who did the run's work: both miners, by name (the injected one as text), their units as the API sums them
  await page.waitForFunction(() => document.querySelectorAll('#work [data-worker]').length === 2, null, { timeout: 10_000 });
  const totals = await cluster.api.runWork(run.id);
  const done = await cluster.run(run.id);
  assert.equal(totals.filter((t) => t.kind === 'forward').reduce((a, t) => a + t.units, 0), 2 * done.microbatchesDone, 'a forward per stage per microbatch');
  const rows = await page.$$eval('#work tbody tr', (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent ?? '')));
  assert.deepEqual(rows.map((r) => r[0]).sort(), [EVIL, 'alpha'].sort());
  for (const r of rows) {
    const id = await page.$eval(`#work [data-worker] >> text=${JSON.stringify(r[0])}`, (el) => el.getAttribute('title')).catch(() => null);
    const forward = totals.find((t) => t.miner === id && t.kind === 'forward')?.units ?? 0;
    assert.ok(forward > 0 && Number(r[1].replace(/,/g, '')) === forward, `${JSON.stringify(r)} against ${forward}`);
  }
  await shoot(page, 'dashboard-run.png');

  for (const [hash, file] of [['#/', 'network'], ['#/runs', 'runs'], ['#/rewards', 'rewards'], ['#/models', 'models']] as const) {
    await page.goto(`${cluster.url}/${hash}`);
    await page.waitForSelector('main table', { timeout: 5_000 });
    await page.waitForTimeout(300);
    await shoot(page, `dashboard-${file}.png`);
  }

  // cancel: refused without the login cookie, even asked for directly; the button is off
  const long = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 100_000, stages: 2, minMiners: 2 });
  await page.goto(`${cluster.url}/#/runs/${long.id}`);
  await page.waitForSelector('#status .badge', { timeout: 5_000 });
  // the traffic between its 2 stages: activations forward and gradients back, whole frames of the run's codec
  await page.waitForFunction(() => Number(document.querySelector('[data-boundary="0"] [data-dir="forward"]')?.getAttribute('data-bytes') ?? 0) > 0, null, { timeout: 20_000 });
  const snapshot = (await (await fetch(`${cluster.url}/events`)).json()) as { runs: { id: string; traffic: { frameBytes: number; boundaries: unknown[] } | null }[] };
  const traffic = snapshot.runs.find((r) => r.id === long.id)?.traffic;
  assert.ok(traffic && traffic.boundaries.length === 1, JSON.stringify(traffic));
  const batch = (await cluster.run(long.id)).batchSize;
  assert.equal(traffic.frameBytes, batch * 16 * 16 * 2, `gpt-micro in f16: ${batch} rows × 16 tokens × 16 channels × 2 bytes`);
  for (const dir of ['forward', 'back']) {
    const sent = Number(await page.$eval(`[data-boundary="0"] [data-dir="${dir}"]`, (e) => e.getAttribute('data-bytes')));
    assert.ok(sent >= 0 && sent % traffic.frameBytes === 0, `${dir}: ${sent} bytes, whole frames`);
  }
  assert.match((await page.getAttribute('[data-boundary="0"]', 'title')) ?? '', /microbatches done across this boundary × the frame size/);
  assert.equal(snapshot.runs.find((r) => r.id === run.id)?.traffic, null, 'an ended run has no traffic');
  // on an unpaid network no stake is read
  assert.deepEqual(await page.evaluate(() => fetch('/events').then((r) => r.json()).then((v: { miners: { stake: unknown }[] }) => v.miners.map((m) => m.stake))), [null, null]);
  assert.equal(await page.$eval('#cancel', (e) => (e as HTMLButtonElement).disabled), true);
  const refused = await page.evaluate((id) => fetch(`/operator/runs/${id}/cancel`, { method: 'POST' }).then((r) => r.status), long.id);
  assert.equal(refused, 401);
  assert.notEqual((await cluster.run(long.id)).status, 'cancelled');

  // log in: the token is exchanged for an HttpOnly cookie, and the address bar no longer holds it
  await page.goto(login);
  assert.equal(page.url(), `${cluster.url}/`);
  const cookies = await context.cookies();
  assert.equal(cookies.length, 1);
  assert.equal(cookies[0].httpOnly, true);
  assert.equal(cookies[0].sameSite, 'Strict');
  assert.equal(await page.evaluate(() => document.cookie), '', 'the page cannot read the cookie');
  await page.waitForFunction(() => document.querySelector('#who')?.textContent?.startsWith('operator'), null, { timeout: 5_000 });
  assert.ok(!(await page.content()).includes(login.split('token=')[1]), 'the token is not in the page');

  await page.goto(`${cluster.url}/#/runs/${long.id}`);
  await page.waitForFunction(() => (document.querySelector('#cancel') as HTMLButtonElement | null)?.disabled === false, null, { timeout: 5_000 });
  await page.click('#cancel');
  await waitStatus(page, 'cancelled', 10_000).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await page.textContent('#message')} ${await page.textContent('#status')}`);
  });
  assert.equal((await cluster.run(long.id)).status, 'cancelled');

  // upgrade: from a job's page the operator moves the job onto a group of the miners alive, as its owner could
  const developer = new JobClient(new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }));
  const job = await developer.submit({ name: 'dash-upgrade', model: 'gpt-micro', data: 'moby-dick', training: { steps: 100_000, batchSize: 8, mergeEvery: 10 } });
  await page.goto(`${cluster.url}/#/jobs/${job.id}`);
  await page.waitForFunction(() => ['started', 'executing'].includes(document.querySelector('#status .badge')?.textContent ?? ''), null, { timeout: 20_000 });
  // its plan on the miners alive: the layouts the planner weighed, the one it chooses (as GET /jobs/:id/plan says)
  await page.waitForSelector('#plan-layouts [data-chosen]', { timeout: 10_000 });
  const plan = (await (await fetch(`${cluster.url}/jobs/${job.id}/plan`)).json()) as JobPlan;
  assert.ok(plan.chosen, JSON.stringify(plan.explanation));
  const chosenRow = await page.$eval('#plan-layouts [data-chosen]', (el) => el.closest('tr')?.querySelector('td')?.textContent);
  assert.equal(chosenRow, `${plan.chosen.stages} × ${plan.chosen.replicas}`);
  assert.equal(await page.$$eval('#plan-layouts tbody tr', (trs) => trs.length), plan.candidates.length);
  await page.waitForFunction(() => (document.querySelector('#upgrade') as HTMLButtonElement | null)?.disabled === false, null, { timeout: 5_000 });
  await page.click('#upgrade');
  await page.waitForFunction(() => /upgrading to \d+ stages? × \d+ replicas?/.test(document.querySelector('#message')?.textContent ?? ''), null, { timeout: 10_000 }).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await page.textContent('#message')}`);
  });
  // the default group of the 2 miners alive (defaultUpgrade: 2 stages of a 2-part model, 1 replica each)
  assert.match((await page.textContent('#message')) ?? '', /upgrading to 2 stages × 1 replica:/);
  assert.ok((await developer.events(job.id)).some((e) => /^by the operator \(dashboard\): upgrade to /.test(e.message)), 'the job records the operator\'s upgrade');
  await page.waitForFunction(() => (document.querySelector('#upgrade') as HTMLButtonElement | null)?.disabled === true, null, { timeout: 5_000 });
  await page.click('#cancel');
  await waitStatus(page, 'cancelled', 10_000);
  assert.equal((await developer.get(job.id)).status, 'cancelled');

  // submit: the operator's form takes a job spec; a spec the orchestrator refuses is shown with its reason, a good one runs to completed
  await page.goto(`${cluster.url}/#/runs`);
  await page.click('#job-form summary');
  await page.fill('#job-spec', JSON.stringify({ name: 'dash-form', model: 'gpt-micro', data: '/etc/passwd', training: { steps: 30 } }));
  await page.click('#job-submit');
  await page.waitForFunction(() => /refused \(400\): .*not data the network's miners load/.test(document.querySelector('#message')?.textContent ?? ''), null, { timeout: 5_000 }).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await page.textContent('#message')}`);
  });
  await page.fill('#job-spec', JSON.stringify({ name: 'dash-form', model: 'gpt-micro', data: 'moby-dick', training: { steps: 30, batchSize: 8, mergeEvery: 10, seed: 7 } }));
  await page.click('#job-submit');
  await page.waitForFunction(() => location.hash.startsWith('#/jobs/job-'), null, { timeout: 5_000 });
  const formJobId = decodeURIComponent(new URL(page.url()).hash.slice('#/jobs/'.length));
  await waitStatus(page, 'completed', 60_000).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await page.textContent('#status')} ${await page.textContent('#message')}`);
  });
  // the operator's job is the operator's: read whole with the page's login (anyone else gets its public part)
  const asOperator = <T>(path: string): Promise<T> => page.evaluate((p) => fetch(p, { credentials: 'same-origin' }).then((r) => r.json()), path) as Promise<T>;
  const formJob = await asOperator<JobView>(`/jobs/${formJobId}`);
  assert.equal(formJob.status, 'completed');
  assert.equal(formJob.owner, zeroAddress, "an unpaid network's operator job is owned by the zero address");
  assert.ok((await asOperator<JobEvent[]>(`/jobs/${formJobId}/events`)).some((e) => e.message === 'submitted by the operator (dashboard)'));
  assert.equal((await developer.view(formJobId)).status, 'completed');
  await assert.rejects(developer.get(formJobId), /not yours/, 'another developer sees its public part only');
  // the badge follows the feed, the timeline follows GET /jobs/:id/events asked when the status changes: it may come a moment later
  await page
    .waitForFunction(() => /waiting submitted[\s\S]*started[\s\S]*executing[\s\S]*completed trained 30 steps/.test(document.querySelector('#timeline')?.textContent ?? ''), null, { timeout: 5_000 })
    .catch(async (err: Error) => {
      throw new Error(`${err.message}: ${await page.textContent('#timeline')}`);
    });

  assert.deepEqual(dialogs, [], 'no script ran from a miner name');
  // the refused cancel (401) and spec (400) are the only errors the browser saw: no script or style refused by the page's policy
  assert.deepEqual(errors.filter((e) => !/40[01]/.test(e)), []);
  const foreign = requests.filter((u) => !u.startsWith(`${cluster.url}/`));
  assert.deepEqual(foreign, [], 'the page talks to its orchestrator only');
  await context.close();
});
