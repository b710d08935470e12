// The Rewards page: every epoch (status, emission, settlement transaction),
// each miner's score and payment in it, the stakes slashed, and the spot
// checks each miner passed and failed. Amounts rounded for people, exact in
// the tooltip.
import type { EpochView } from '../../../src/api/schemas.ts';
import { badge, fill, h, table, type Child } from '../dom.ts';
import { displayNim, num, short, time } from '../format.ts';
import { livePage, type Page, type PageContext } from './page.ts';

/** Epochs shown with their whole split: the newest that paid or slashed anyone (an epoch without work has nothing to show). */
const DETAILED = 10;

export function rewardsPage(root: HTMLElement, ctx: PageContext): Page {
  const summary = h('p', { class: 'summary' });
  const epochs = h('div', { id: 'epochs' });
  const checks = h('div', { id: 'checks' });
  const splits = h('div', { id: 'splits' });
  fill(root, h('h1', null, 'Rewards'), summary, h('h2', null, 'Epochs'), epochs, h('h2', null, 'Spot checks per miner'), checks, h('h2', null, 'Splits and slashes'), splits);
  return livePage(ctx, ['epochs', 'runs'], () => {
    const list = ctx.feed.store.epochs;
    if (!list) return fill(summary, 'waiting for the orchestrator…');
    fill(summary, list.paid ? `paid on chain · ${list.epochs.length} epochs shown` : 'this network is unpaid (--no-chain): work is scored, nothing is paid');
    fill(
      epochs,
      table(
        ['epoch', 'status', 'opened', 'closed', 'emission NIM', 'miners', 'slashes', 'transaction'],
        list.epochs.map((e) => [`#${e.id}`, badge(e.status), time(e.openedAt), time(e.closedAt), nim(e.emission), num(e.rewards.length), num(e.slashes.length), e.txHash ? h('code', { title: e.txHash }, short(e.txHash, 8)) : e.error ? h('span', { class: 'error', title: e.error }, 'error') : '–']),
        { class: 'grid' },
      ),
    );
    fill(checks, checkTable(ctx));
    const detailed = list.epochs.filter((e) => e.rewards.length || e.inferencePayments.length || e.slashes.length).slice(0, DETAILED);
    fill(splits, detailed.length ? detailed.map(epochDetail) : h('p', { class: 'muted' }, 'no epoch has paid or slashed anyone yet'));
  });
}

function nim(amount: string | null): Child {
  return amount === null ? '–' : h('span', { title: `${amount} NIM` }, displayNim(amount));
}

function epochDetail(e: EpochView): HTMLElement {
  return h(
    'section',
    { class: 'epoch', data: { epoch: String(e.id) } },
    h('h3', null, `Epoch #${e.id} `, badge(e.status)),
    table(
      ['miner', 'score', 'NIM', 'units'],
      e.rewards.map((r) => [r.name ?? h('code', { title: r.miner }, short(r.miner)), num(r.score, 3), h('span', { title: `${r.amount} NIM (${r.amountWei} wei)` }, displayNim(r.amount)), Object.entries(r.units).map(([k, v]) => `${k} ${num(v, 1)}`).join(' · ')]),
      { class: 'grid' },
    ),
    e.inferencePayments.length
      ? table(
          ['payee', 'role', 'NIM (inference)', 'status'],
          e.inferencePayments.map((p) => [p.name ?? h('code', { title: p.payee }, short(p.payee)), p.role, h('span', { title: `${p.amount} NIM` }, displayNim(p.amount)), badge(p.status)]),
          { class: 'grid' },
        )
      : null,
    e.slashes.length
      ? table(
          ['slashed miner', 'failed checks', 'NIM', 'status', 'reason', 'transaction'],
          e.slashes.map((s) => [h('code', { title: s.miner }, short(s.miner)), num(s.failed), nim(s.amount), badge(s.status), s.reason, s.txHash ? h('code', { title: s.txHash }, short(s.txHash, 8)) : '–']),
          { class: 'grid' },
        )
      : h('p', { class: 'muted' }, 'no slashes'),
  );
}

/** Spot checks of the runs shown, summed per miner. */
function checkTable(ctx: PageContext): HTMLElement {
  const byMiner = new Map<string, { name: string; passed: number; failed: number; open: number }>();
  for (const r of ctx.feed.store.runs ?? [])
    for (const c of r.checks) {
      const v = byMiner.get(c.miner) ?? { name: c.name ?? short(c.miner), passed: 0, failed: 0, open: 0 };
      v.passed += c.passed;
      v.failed += c.failed;
      v.open += c.open;
      byMiner.set(c.miner, v);
    }
  return table(
    ['miner', 'passed', 'failed', 'open'],
    [...byMiner.values()].map((v) => [v.name, num(v.passed), v.failed ? h('span', { class: 'error' }, num(v.failed)) : '0', num(v.open)]),
    { class: 'grid' },
  );
}
