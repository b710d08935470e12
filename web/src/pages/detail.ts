// A run's or a job's own page: its status and timeline, the live loss chart
// (train loss, held-out loss at checkpoints, tokens/s), its figures, its
// checkpoints with download links (for the operator), its pipeline, the work
// each miner did on its run, its run's merge rounds (./merges.ts), a job's
// plan on the miners alive now, and the operator's buttons: cancel, and for a
// job upgrade (onto the default group for the miners alive, as `nbcli job
// upgrade` without flags).
import type { JobEvent, JobView } from '../../../src/api/jobs.ts';
import type { DashboardMiner, LossPoint } from '../../../src/api/dashboard.ts';
import type { RunView, WorkTotal } from '../../../src/api/schemas.ts';
import { FINAL_JOB_STATUSES, FINAL_RUN_STATUSES } from '../status.ts';
import { api, ApiError } from '../api.ts';
import { LossChart } from '../chart.ts';
import { badge, fill, h, table, type Child } from '../dom.ts';
import { bytes, duration, num, short, time } from '../format.ts';
import type { Page, PageContext } from './page.ts';
import { planView } from './job-plan.ts';
import { mergesSection } from './merges.ts';
import { pipeline } from './pipeline.ts';
import { progress } from './runs.ts';


export function detailPage(root: HTMLElement, ctx: PageContext, kind: 'run' | 'job', id: string): Page {
  const status = h('span', { id: 'status' });
  const cancel = h('button', { id: 'cancel', type: 'button', disabled: !ctx.operator, title: ctx.operator ? `cancel this ${kind}` : 'log in as the operator to cancel' }, `Cancel ${kind}`);
  const upgrade = kind === 'job' ? h('button', { id: 'upgrade', type: 'button', disabled: !ctx.operator, title: ctx.operator ? 'move this job onto the default group for the miners alive (2 stages × as many replicas as they allow, as nbcli job upgrade does)' : 'log in as the operator to upgrade' }, 'Upgrade job') : null;
  const facts = h('dl', { class: 'facts' });
  const timeline = h('ol', { id: 'timeline', class: 'timeline' });
  const chartEl = h('div', { id: 'chart', class: 'chart' });
  const checkpoints = h('div', { id: 'checkpoints' });
  const pipe = h('div', { id: 'pipeline' });
  const work = h('div', { id: 'work' });
  const plan = h('div', { id: 'plan' });
  const merges = mergesSection(() => ctx.feed.store.miners ?? []);
  fill(
    root,
    h('h1', null, `${kind === 'run' ? 'Run' : 'Job'} `, h('code', null, id), ' ', status),
    h('div', { class: 'actions' }, upgrade, upgrade ? ' ' : null, cancel),
    facts,
    h('h2', null, 'Loss'),
    chartEl,
    h('h2', null, 'Status timeline'),
    timeline,
    h('h2', null, 'Checkpoints'),
    checkpoints,
    h('h2', null, 'Pipeline'),
    pipe,
    h('h2', null, 'Work per miner'),
    work,
    h('h2', null, 'Merge rounds'),
    merges.el,
    kind === 'job' ? [h('h2', null, 'Plan on the miners alive now'), h('div', { class: 'actions' }, h('button', { type: 'button', id: 'plan-refresh', on: { click: () => loadPlan() } }, 'Plan again')), plan] : null,
  );
  const loadPlan = (): void => {
    if (kind !== 'job') return;
    api
      .jobPlan(id)
      .then((p) => fill(plan, planView(p)))
      .catch((err: Error) => fill(plan, h('p', { class: 'muted' }, `no plan: ${err.message}`)));
  };
  loadPlan();
  const chart = new LossChart(chartEl);
  const key = `${kind}:${id}`;
  // points that arrive live before the curve so far: added after it
  let early: LossPoint[] | null = [];
  const offLoss = ctx.feed.listenLoss((k, points) => {
    if (k !== key) return;
    if (early) early.push(...points);
    else chart.add(points);
  });
  let statuses: { at: number; status: string; message?: string }[] = [];
  void api
    .loss(kind, id)
    .then((hist) => {
      chart.add(hist.points);
      if (kind === 'run') statuses = hist.statuses;
    })
    .catch((err: Error) => ctx.notify(`loss history: ${err.message}`, true))
    .finally(() => {
      chart.add(early ?? []);
      early = null;
      draw();
    });

  // a job's timeline (GET /jobs/:id/events): asked again when its status, checkpoints or run change; only the newest
  // answer is shown, so an older request that returns late cannot put back a timeline without the latest status
  let jobEventsKey = '';
  let jobEventsAsked = 0;
  const refreshJobEvents = (job: JobView): void => {
    const k = `${job.status}/${job.checkpoints.length}/${job.runId}`;
    if (k === jobEventsKey) return;
    jobEventsKey = k;
    const asked = ++jobEventsAsked;
    api
      .jobEvents(id)
      .then((events: JobEvent[]) => {
        if (asked !== jobEventsAsked) return;
        statuses = events.map((e) => ({ at: e.at, status: e.status, message: e.message }));
        draw();
      })
      .catch((err: Error) => {
        if (asked !== jobEventsAsked) return;
        jobEventsKey = ''; // asked again at the next change
        ctx.notify(`job events: ${err.message}`, true);
      });
  };

  cancel.addEventListener('click', () => {
    cancel.setAttribute('disabled', '');
    api
      .cancel(kind, id)
      .then((a) => ctx.notify(`${a.kind} ${a.id}: ${a.status}`))
      .catch((err: Error) => {
        ctx.notify(err instanceof ApiError ? `refused (${err.status}): ${err.message}` : err.message, true);
        if (ctx.operator) cancel.removeAttribute('disabled');
      });
  });

  upgrade?.addEventListener('click', () => {
    upgrade.setAttribute('disabled', '');
    api
      .upgrade(id)
      .then((a) => ctx.notify(`job ${a.id}: upgrading to ${a.stages} stage${a.stages === 1 ? '' : 's'} × ${a.replicas} replica${a.replicas === 1 ? '' : 's'}${a.message ? `: ${a.message}` : ''}`))
      .catch((err: Error) => {
        ctx.notify(err instanceof ApiError ? `refused (${err.status}): ${err.message}` : err.message, true);
        if (ctx.operator) upgrade.removeAttribute('disabled');
      });
  });

  // who did the run's work (GET /runs/:id/work): fetched again when its counters move, one request at a time
  let workShown = '';
  let workWanted = '';
  let workBusy = false;
  const refreshWork = (r: RunView): void => {
    workWanted = `${r.id}/${r.microbatchesDone}/${r.mergesDone}/${r.status}`;
    if (workBusy || workWanted === workShown) return;
    workBusy = true;
    const asked = workWanted;
    void api
      .runWork(r.id)
      .then((totals) => {
        workShown = asked;
        fill(work, workTable(totals, ctx.feed.store.miners ?? []));
      })
      .catch(() => undefined)
      .finally(() => {
        workBusy = false;
        if (workWanted !== workShown) refreshWork(r);
      });
  };

  const draw = (): void => {
    const { runs, jobs } = ctx.feed.store;
    const job = kind === 'job' ? jobs?.find((j) => j.id === id) : undefined;
    const run = kind === 'run' ? runs?.find((r) => r.id === id) : runs?.find((r) => r.id === job?.runId);
    const subject = kind === 'job' ? job : run;
    if (!subject) {
      fill(status, runs === null ? 'loading…' : 'not found (or older than the newest shown)');
      return;
    }
    fill(status, badge(subject.status));
    // a run's timeline: what the orchestrator recorded before this page opened, then what the feed shows
    if (kind === 'run' && early === null && statuses[statuses.length - 1]?.status !== subject.status) statuses.push({ at: Date.now(), status: subject.status });
    const ended = kind === 'job' ? FINAL_JOB_STATUSES.includes(subject.status as JobView['status']) : FINAL_RUN_STATUSES.includes(subject.status as RunView['status']);
    if (ended || !ctx.operator) cancel.setAttribute('disabled', '');
    if (upgrade && (ended || !ctx.operator || job?.upgrade)) upgrade.setAttribute('disabled', '');
    if (job) {
      refreshJobEvents(job);
      chart.setHeldout(job.checkpoints.filter((c) => c.heldoutLoss !== null).map((c) => [c.step, c.heldoutLoss!]));
    }
    fill(facts, kind === 'job' && job ? jobFacts(job) : run ? runFacts(run) : []);
    fill(timeline, timelineItems(statuses, subject.createdAt));
    fill(checkpoints, job ? jobCheckpoints(job, ctx.operator) : run ? runCheckpoint(run, ctx.operator) : []);
    fill(pipe, run ? pipeline(run) : h('p', { class: 'muted' }, 'not placed yet'));
    if (run) {
      refreshWork(run);
      merges.update(run);
    }
  };
  const off = ctx.feed.listen((changed) => {
    if (changed === 'runs' || changed === 'jobs') draw();
  });
  draw();
  return {
    dispose: () => {
      off();
      offLoss();
      chart.dispose();
    },
  };
}

const WORK_COLUMNS = ['forward', 'backward', 'merge', 'dropped', 'invalid', 'failed_check'] as const;

/** A run's work per miner: units of each kind (fractions are shares of a unit: a replica's part of a merge). */
function workTable(totals: readonly WorkTotal[], miners: readonly DashboardMiner[]): HTMLElement {
  const names = new Map(miners.map((m) => [m.id, m.name]));
  const byMiner = new Map<string, Map<string, number>>();
  for (const t of totals) (byMiner.get(t.miner) ?? byMiner.set(t.miner, new Map()).get(t.miner)!).set(t.kind, t.units);
  return table(
    ['miner', ...WORK_COLUMNS.map((k) => k.replace('_', ' '))],
    [...byMiner].map(([id, units]) => [h('span', { title: id, data: { worker: id } }, names.get(id) ?? short(id)), ...WORK_COLUMNS.map((k) => {
      const u = units.get(k) ?? 0;
      return num(u, Number.isInteger(u) ? 0 : 2);
    })]),
    { class: 'grid' },
  );
}

function fact(term: string, value: Child): Child[] {
  return [h('dt', null, term), h('dd', null, value)];
}

function runFacts(r: RunView): Child[] {
  return [
    fact('model', `${r.model} on ${r.data}`),
    fact('progress', progress(r.microbatchesDone, r.steps)),
    fact('train loss', r.loss === null ? '–' : r.loss.toFixed(4)),
    fact('tokens/s', FINAL_RUN_STATUSES.includes(r.status) ? '–' : num(r.tokensPerSecond)),
    fact('tokens', num(r.tokensDone)),
    fact('merges', `${num(r.mergesDone)} (every ${r.mergeEvery} steps)`),
    fact('owner', r.owner ? h('code', { title: r.owner }, short(r.owner)) : '–'),
    r.message ? fact('message', r.message) : null,
  ].flat();
}

function jobFacts(j: JobView): Child[] {
  return [
    fact('name', j.name),
    fact('progress', progress(j.step, j.steps)),
    fact('train loss', j.loss === null ? '–' : j.loss.toFixed(4)),
    fact('tokens/s', num(j.tokensPerSecond)),
    fact('ETA', j.etaMs === null ? '–' : duration(j.etaMs)),
    fact('run', j.runId ? h('a', { href: `#/runs/${encodeURIComponent(j.runId)}` }, j.runId) : '–'),
    fact('owner', h('code', { title: j.owner }, short(j.owner))),
    j.upgrade ? fact('upgrade', `to ${j.upgrade.stages} stages × ${j.upgrade.replicas} replicas`) : null,
    j.message ? fact('message', j.message) : null,
  ].flat();
}

function timelineItems(statuses: readonly { at: number; status: string; message?: string }[], createdAt: number): Child[] {
  const list = statuses.length ? statuses : [{ at: createdAt, status: 'created' }];
  return list.map((s) => h('li', null, h('span', { class: 'when' }, time(s.at)), ' ', badge(s.status), s.message ? h('span', { class: 'muted' }, ` ${s.message}`) : null));
}

function jobCheckpoints(j: JobView, operator: boolean): Child {
  return table(
    ['step', 'tokens', 'train loss', 'held-out loss', 'size', 'sha256', 'kept', 'download'],
    [...j.checkpoints].reverse().map((c) => [
      num(c.step),
      num(c.tokens),
      c.loss === null ? '–' : c.loss.toFixed(4),
      c.heldoutLoss === null ? '–' : c.heldoutLoss.toFixed(4),
      bytes(c.bytes),
      h('code', { title: c.sha256 }, short(c.sha256)),
      c.expiresAt === null ? 'while it runs' : `until ${new Date(c.expiresAt).toLocaleString('en-GB')}`,
      operator
        ? h('a', { href: `/operator/jobs/${encodeURIComponent(j.id)}/checkpoints/${c.step}`, download: `${j.id}-step${c.step}.safetensors` }, 'download')
        : h('code', { title: 'signed with the owner wallet' }, `nbcli checkpoint download ${j.id} --step ${c.step}`),
    ]),
    { class: 'grid' },
  );
}

function runCheckpoint(r: RunView, operator: boolean): Child {
  if (r.status !== 'completed' && r.mergesDone === 0) return h('p', { class: 'muted' }, 'none yet: a whole-model checkpoint is assembled from the stages’ merged states');
  return operator
    ? h('p', null, h('a', { href: `/operator/runs/${encodeURIComponent(r.id)}/checkpoint`, download: `${r.id}.safetensors` }, 'download the whole-model checkpoint'), h('span', { class: 'muted' }, ' (the stages’ latest merged states)'))
    : h('p', null, h('code', null, `nbcli run checkpoint ${r.id}`), h('span', { class: 'muted' }, ' (its owner), or log in as the operator'));
}
