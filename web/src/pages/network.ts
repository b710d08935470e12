// The Network page: every miner (name, address, speed, where its GPT stages
// run (wasm or webgpu, and the GPU adapter's name), memory, what it does,
// its work done, its work per minute lately and its dropped work, what it
// earned, its stake on the chain, when it was last seen) and the
// pipeline of each run under way, with the traffic between its stages.
import type { DashboardMiner } from '../../../src/api/dashboard.ts';
import { FINAL_RUN_STATUSES } from '../status.ts';
import { fill, h, table } from '../dom.ts';
import { ago, bytes, displayNim, num, short } from '../format.ts';
import { livePage, type Page, type PageContext } from './page.ts';
import { pipeline } from './pipeline.ts';

const DONE_KINDS = ['forward', 'backward', 'merge', 'inference'] as const;

export function networkPage(root: HTMLElement, ctx: PageContext): Page {
  const summary = h('p', { class: 'summary' });
  const miners = h('div', { id: 'miners' });
  const pipes = h('div', { id: 'pipelines' });
  fill(root, h('h1', null, 'Network'), summary, h('h2', null, 'Miners'), miners, h('h2', null, 'Pipelines of the runs under way'), pipes);
  return livePage(ctx, ['miners', 'runs'], () => {
    const { miners: list, runs } = ctx.feed.store;
    const active = (runs ?? []).filter((r) => !FINAL_RUN_STATUSES.includes(r.status));
    const alive = (list ?? []).filter((m) => m.alive);
    fill(summary, list === null ? 'waiting for the orchestrator…' : `${alive.length} of ${list.length} miners alive · ${num(alive.reduce((a, m) => a + m.gflops, 0), 0)} GFLOP/s · ${active.length} runs under way · ${num(active.reduce((a, r) => a + r.tokensPerSecond, 0))} tokens/s`);
    if (list !== null) fill(miners, minerTable(list));
    fill(pipes, active.length ? active.map((r) => h('section', null, h('h3', null, h('a', { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id), ` · ${r.model} · ${r.status}`), pipeline(r))) : h('p', { class: 'muted' }, 'no run under way'));
  });
}

function minerTable(list: readonly DashboardMiner[]): HTMLTableElement {
  const now = Date.now();
  const sorted = [...list].sort((a, b) => Number(b.alive) - Number(a.alive) || a.name.localeCompare(b.name));
  return table(
    ['name', 'address', 'GFLOP/s', 'backend', 'threads', 'memory', 'bandwidth', 'stage / role', 'work done', 'work/min', 'dropped', 'NIM earned', 'stake', 'last seen'],
    sorted.map((m) => [
      h('span', { class: m.alive ? 'alive' : 'gone', data: { miner: m.id } }, m.name),
      h('code', { title: m.id }, short(m.id)),
      num(m.gflops, 1),
      backend(m),
      num(m.threads),
      bytes(m.memoryBytes),
      `${num(m.bandwidthMbps)} Mbit/s`,
      m.roles.length ? m.roles.map((r) => h('div', null, `${r.kind === 'training' ? 'trains' : 'serves'} stage ${r.stage + 1}/${r.stages} of ${r.of} (replica ${r.replica}/${r.replicas})`)) : h('span', { class: 'muted' }, m.serve ? `idle (offers ${m.serve})` : 'idle'),
      num(DONE_KINDS.reduce((a, k) => a + (m.units[k] ?? 0), 0), 1),
      h('span', { title: 'forward, backward, merge and inference units per minute over about the last minute' }, m.workPerMinute === null ? '–' : num(m.workPerMinute, 1)),
      num(m.units.dropped ?? 0, 1),
      h('span', { title: `${m.earned} NIM (${m.earnedWei} wei)` }, displayNim(m.earned)),
      stake(m),
      m.alive ? ago(m.lastSeen, now) : `gone (${ago(m.lastSeen, now)})`,
    ]),
    { class: 'grid' },
  );
}

/** Where its GPT stages run, and under it the GPU adapter's name as it reported it (text, never markup), marked when it is a software one. */
function backend(m: DashboardMiner): HTMLSpanElement {
  const adapter = [m.adapter, m.softwareAdapter ? '(software)' : null].filter((x) => x !== null).join(' ');
  const title = m.softwareAdapter ? 'a software adapter (such as SwiftShader): right answers at CPU speed' : 'the GPU adapter it reported';
  return h('span', { data: { backend: m.id } }, m.backend, adapter ? h('div', { class: 'muted', title, data: { adapter: m.id } }, adapter) : null);
}

/** Its stake, rounded (exact in the tooltip), and what it is unstaking if anything; – when not read (an unpaid network, or not yet). */
function stake(m: DashboardMiner): HTMLSpanElement {
  const s = m.stake;
  if (s === null) return h('span', { class: 'muted', title: 'not read from the chain (an unpaid network, or not yet)', data: { stake: m.id } }, '–');
  const unstaking = s.unstakingWei !== '0';
  const title = `${s.staked} NIM staked (${s.stakedWei} wei)${unstaking ? `; ${s.unstaking} NIM unstaking (${s.unstakingWei} wei)` : ''}; read from the chain at most every 30 s`;
  return h('span', { title, data: { stake: m.id, wei: s.stakedWei } }, displayNim(s.staked), unstaking ? h('span', { class: 'muted' }, ` (+${displayNim(s.unstaking)} unstaking)`) : null);
}
