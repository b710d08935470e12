// The Runs and jobs page: every job and every run with its status and
// progress, each linking to its own page; the operator's job form.
import { FINAL_RUN_STATUSES } from '../status.ts';
import { badge, fill, h, table } from '../dom.ts';
import { ago, num, short } from '../format.ts';
import { jobSubmitForm } from './job-submit.ts';
import { livePage, type Page, type PageContext } from './page.ts';

export function runsPage(root: HTMLElement, ctx: PageContext): Page {
  const jobs = h('div', { id: 'jobs' });
  const runs = h('div', { id: 'runs' });
  fill(root, h('h1', null, 'Runs and jobs'), h('h2', null, 'Jobs'), jobSubmitForm(ctx), jobs, h('h2', null, 'Runs'), runs);
  return livePage(ctx, ['runs', 'jobs'], () => {
    const now = Date.now();
    const { jobs: jobList, runs: runList } = ctx.feed.store;
    fill(
      jobs,
      table(
        ['job', 'name', 'status', 'progress', 'loss', 'tokens/s', 'owner', 'submitted'],
        (jobList ?? []).map((j) => [
          h('a', { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id),
          j.name,
          badge(j.status),
          progress(j.step, j.steps),
          j.loss === null ? '–' : j.loss.toFixed(4),
          num(j.tokensPerSecond),
          h('code', { title: j.owner }, short(j.owner)),
          ago(j.createdAt, now),
        ]),
        { class: 'grid' },
      ),
    );
    fill(
      runs,
      table(
        ['run', 'model', 'status', 'progress', 'loss', 'tokens/s', 'stages × replicas', 'merges', 'created'],
        (runList ?? []).map((r) => [
          h('a', { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id),
          r.model,
          badge(r.status),
          progress(r.microbatchesDone, r.steps),
          r.loss === null ? '–' : r.loss.toFixed(4),
          FINAL_RUN_STATUSES.includes(r.status) ? '–' : num(r.tokensPerSecond),
          r.stages.length ? `${r.stages.length} × ${Math.max(...r.stages.map((s) => s.replicas.length))}` : '–',
          num(r.mergesDone),
          ago(r.createdAt, now),
        ]),
        { class: 'grid' },
      ),
    );
  });
}

export function progress(done: number, total: number): HTMLElement {
  const share = total > 0 ? Math.min(1, done / total) : 0;
  const bar = h('span', { class: 'bar' }, h('span', { class: 'fill' }));
  (bar.firstChild as HTMLElement).style.width = `${(share * 100).toFixed(1)}%`;
  return h('span', { class: 'progress', title: `${done} of ${total}` }, bar, ` ${num(done)} / ${num(total)}`);
}
