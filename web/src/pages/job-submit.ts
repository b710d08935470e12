// The operator's job form on the Runs and jobs page: a job spec (the JSON
// `nbcli job init` writes, docs/jobs.md) submitted as the operator's own job
// (POST /operator/jobs). Such a job pays nothing from an escrow: on a paid
// network its miners earn the emission, and a spec with a budget is refused
// (developers pay from their wallet with nbcli job submit). The orchestrator
// checks the spec and names each problem; the page only checks that it is JSON.
import { api, ApiError } from '../api.ts';
import { h } from '../dom.ts';
import type { PageContext } from './page.ts';

/** A small job that trains in minutes on a few home machines. */
export const STARTER_SPEC = {
  name: 'dashboard-job',
  model: 'gpt-micro',
  data: 'moby-dick',
  training: { steps: 200, batchSize: 8, learningRate: 0.001, mergeEvery: 50, seed: 1337 },
  checkpointEvery: 100,
  limits: { timeout: '1h', idleTimeout: '10m' },
};

export function jobSubmitForm(ctx: PageContext): HTMLElement {
  const spec = h('textarea', { id: 'job-spec', class: 'code' });
  spec.rows = 12;
  spec.spellcheck = false;
  spec.value = JSON.stringify(STARTER_SPEC, null, 2);
  const submit = h('button', { id: 'job-submit', type: 'button', disabled: !ctx.operator, title: ctx.operator ? 'submit this spec as the operator' : 'log in as the operator to submit' }, 'Submit job');

  submit.addEventListener('click', () => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(spec.value);
    } catch (err) {
      ctx.notify(`the spec is not JSON: ${(err as Error).message}`, true);
      return;
    }
    submit.setAttribute('disabled', '');
    api
      .submitJob(parsed)
      .then((job) => {
        ctx.notify(`job ${job.id} submitted: ${job.status}`);
        location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
      })
      .catch((err: Error) => ctx.notify(err instanceof ApiError ? `refused (${err.status}): ${err.message}` : err.message, true))
      .finally(() => {
        if (ctx.operator) submit.removeAttribute('disabled');
      });
  });

  return h(
    'details',
    { id: 'job-form', class: 'form' },
    h('summary', null, 'Submit a job'),
    h(
      'p',
      { class: 'muted' },
      ctx.operator
        ? "A job spec in JSON, as nbcli job init writes it. The job is the operator's: it is paid from no escrow (miners earn the emission), so it takes no budget."
        : 'Log in as the operator (the URL the orchestrator printed) to submit from here; developers submit with nbcli job submit.',
    ),
    spec,
    h('div', { class: 'actions' }, submit),
  );
}
