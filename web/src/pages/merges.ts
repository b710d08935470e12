// A run's merge rounds on its page (and on its job's page): GET /runs/:id/merges,
// newest first, each stage's round as a row: its phase, the replicas in it,
// when it started and how long it took, its partitions, the pseudo-gradient
// slices and merged partitions that arrived, and how it was settled (whose
// merged partitions everyone applied, which were not the merge of their
// inputs, which the orchestrator merged itself). Fetched again when the run's
// step, merge count, status or a stage's merge phase moves, one request at a time.
import type { DashboardMiner } from '../../../src/api/dashboard.ts';
import type { MergeRoundView, RunMerges } from '../../../src/api/merges.ts';
import type { RunView } from '../../../src/api/schemas.ts';
import { api } from '../api.ts';
import { badge, fill, h, table, type Child } from '../dom.ts';
import { duration, num, short, time } from '../format.ts';
import { FINAL_RUN_STATUSES } from '../status.ts';

/** Replicas named in a cell; the others are counted (every one in its tooltip). */
const NAMES_SHOWN = 4;

export interface MergesSection {
  /** where the table is drawn */
  readonly el: HTMLElement;
  /** the run as the feed shows it now: fetches its rounds when they may have moved */
  update(run: RunView): void;
}

/** The section of a run's merge rounds; `miners` names the replicas. */
export function mergesSection(miners: () => readonly DashboardMiner[]): MergesSection {
  const el = h('div', { id: 'merges' }, h('p', { class: 'muted' }, 'none yet'));
  let shown = '';
  let wanted = '';
  let busy = false;
  let latest: RunView | null = null;
  const update = (run: RunView): void => {
    latest = run;
    wanted = `${run.id}/${run.microbatchesDone}/${run.mergesDone}/${run.status}/${run.stages.map((s) => `${s.round}${s.mergePhase ?? ''}`).join(',')}`;
    if (busy || wanted === shown) return;
    busy = true;
    const asked = wanted;
    void api.runMerges(run.id)
      .then((answer) => {
        shown = asked;
        fill(el, mergesView(answer, run, miners()));
      })
      .catch((err: Error) => {
        shown = asked;
        fill(el, h('p', { class: 'muted' }, `merge rounds: ${err.message}`));
      })
      .finally(() => {
        busy = false;
        if (latest && wanted !== shown) update(latest);
      });
  };
  return { el, update };
}

/** The table of rounds, and a note when the orchestrator no longer keeps some. */
export function mergesView(answer: RunMerges, run: RunView, miners: readonly DashboardMiner[], now: number = Date.now()): HTMLElement {
  const names = new Map(miners.map((m) => [m.id, m.name]));
  const name = (id: string): string => names.get(id) ?? short(id);
  const doneFirstStage = answer.rounds.filter((r) => r.stage === 0 && r.status === 'done').length;
  const older = run.mergesDone - doneFirstStage;
  return h(
    'div',
    null,
    table(
      ['round', 'stage', 'status', 'replicas', 'started', 'duration', 'partitions', 'uploads', 'results', 'outcome'],
      answer.rounds.map((r) => [
        h('span', { data: { round: String(r.round), stage: String(r.stage) } }, num(r.round)),
        num(r.stage),
        badge(r.status),
        replicasCell(r.replicas, name),
        time(r.startedAt),
        durationCell(r, now),
        r.partitions === 0 ? h('span', { class: 'muted', title: 'one replica: nothing to merge' }, '–') : num(r.partitions),
        countCell(r, r.uploads, 'pseudo-gradient slices received (one per partition and replica)'),
        countCell(r, r.results, 'merged partitions received from their mergers'),
        outcomeCell(r, name),
      ]),
      { class: 'grid', id: 'merge-rounds' },
    ),
    answer.truncated ? h('p', { class: 'muted' }, `the ${answer.rounds.length} newest rounds shown; the orchestrator keeps more`) : null,
    older > 0 ? h('p', { class: 'muted', data: { 'merges-done': String(run.mergesDone) } }, `${num(run.mergesDone)} merge${run.mergesDone === 1 ? '' : 's'} done, ${num(older)} not listed: ${keptWords(run)}`) : null,
  );
}

/** What the orchestrator keeps of a run's rounds (src/orchestrator/blobs/gc.ts). */
function keptWords(run: RunView): string {
  return FINAL_RUN_STATUSES.includes(run.status)
    ? 'the rounds of an ended run are collected (its checkpoint is kept)'
    : 'the orchestrator keeps each stage’s latest done round and its open one (older ones only while a spot check needs them)';
}

function replicasCell(replicas: readonly string[], name: (id: string) => string): Child {
  if (replicas.length === 0) return h('span', { class: 'muted' }, 'none');
  const shown = replicas.slice(0, NAMES_SHOWN).map((id) => name(id));
  const more = replicas.length - shown.length;
  return h('span', { title: replicas.map((id) => `${name(id)} (${id})`).join('\n'), data: { replicas: String(replicas.length) } }, shown.join(', '), more > 0 ? ` +${more} more` : null);
}

function durationCell(r: MergeRoundView, now: number): Child {
  if (r.status !== 'done') return h('span', { title: `${r.status} since ${time(r.phaseAt)}` }, `${duration(now - r.startedAt)} so far`);
  // the close of a round is not recorded: from its start to the start of its last phase (applying)
  return h('span', { title: `from ${time(r.startedAt)} to ${time(r.phaseAt)}` }, duration(r.phaseAt - r.startedAt));
}

function countCell(r: MergeRoundView, count: number, what: string): Child {
  if (r.partitions === 0) return h('span', { class: 'muted' }, '–');
  if (r.workCollected && count === 0) return h('span', { class: 'muted', title: 'collected once a later round of its stage was done' }, 'collected');
  return h('span', { title: what }, num(count));
}

const OUTCOME_WORDS: Record<MergeRoundView['outcome'], string> = {
  single: 'one replica: its own state',
  pending: 'in progress',
  agreed: 'mergers agreed',
  recomputed: 'recomputed',
  mismatch: 'mismatch',
  abandoned: 'nothing merged: every replica left',
  collected: 'merged (details collected)',
};

function outcomeCell(r: MergeRoundView, name: (id: string) => string): Child {
  const words: string[] = [OUTCOME_WORDS[r.outcome]];
  if (r.recomputed > 0) words.push(`${num(r.recomputed)} of ${num(r.partitions)} partitions merged by the orchestrator`);
  if (r.mismatches.length > 0) words.push(r.mismatches.map((m) => `${name(m.miner)} (partition ${m.partition})`).join(', '));
  if (r.status === 'done' && !r.stateSaved) words.push('no new state saved: the stage kept its last one');
  const accepted = r.accepted.map((a) => `${name(a.miner)}: ${a.partitions} partition${a.partitions === 1 ? '' : 's'}`).join('\n');
  return h(
    'span',
    { class: `merge-${r.outcome}`, title: accepted ? `applied merged partitions from\n${accepted}` : undefined, data: { outcome: r.outcome } },
    words.join('; '),
  );
}
