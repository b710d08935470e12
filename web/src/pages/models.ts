// The Models page: the models stored to publish (name, sha256, owner, size,
// source job) and their deployments (status, stages, the miners serving each
// stage and what they reported), with each model's ModelRegistry id and price
// per 1,000 tokens as read from the chain; the operator deploys a model (one replica,
// the stages the planner picks, as nbcli model deploy without flags does) and
// undeploys it. Its owner is paid for its tokens either way.
import type { DeploymentView } from '../../../src/api/deployments.ts';
import type { DashboardModel } from '../../../src/api/dashboard.ts';
import { api, ApiError } from '../api.ts';
import { badge, fill, h, table, type Child } from '../dom.ts';
import { ago, bytes, displayNim, short } from '../format.ts';
import { livePage, type Page, type PageContext } from './page.ts';

export function modelsPage(root: HTMLElement, ctx: PageContext): Page {
  const models = h('div', { id: 'models' });
  const deployments = h('div', { id: 'deployments' });
  fill(root, h('h1', null, 'Models'), h('h2', null, 'Stored models'), models, h('h2', null, 'Deployments'), deployments);
  return livePage(ctx, ['models', 'deployments'], () => {
    const now = Date.now();
    const { models: list, deployments: deps } = ctx.feed.store;
    fill(
      models,
      table(
        ['name', 'sha256', 'model', 'owner', 'size', 'from', 'stored', 'registry', 'price / 1k tokens', 'deployment', ''],
        (list ?? []).map((m) => [
          m.name,
          h('code', { title: m.sha256 }, short(m.sha256, 8)),
          `${m.kind} · ${m.model}`,
          h('code', { title: m.owner }, short(m.owner)),
          bytes(m.bytes),
          m.jobId ? h('a', { href: `#/jobs/${encodeURIComponent(m.jobId)}` }, `${m.jobId} step ${m.step}`) : 'uploaded',
          ago(m.createdAt, now),
          ...listing(m),
          m.deployment ? badge(m.deployment.status) : h('span', { class: 'muted' }, 'not deployed'),
          deployButton(m, ctx),
        ]),
        { class: 'grid' },
      ),
    );
    fill(
      deployments,
      table(
        ['model', 'status', 'replicas', 'stages and miners', 'message', 'last request'],
        (deps ?? []).map((d) => [d.name, badge(d.status), String(d.replicas), stagesOf(d), d.message ?? d.undeployReason ?? '', ago(d.lastRequestAt, now)]),
        { class: 'grid' },
      ),
    );
  });
}

/** Its registry id and price (with the registry's deployed flag in the tooltip), as last read from the chain. */
function listing(m: DashboardModel): [Child, Child] {
  const l = m.listing;
  if (l === null) return [h('span', { class: 'muted', title: 'not read from the chain (an unpaid network, or not yet)' }, '–'), '–'];
  if (!l.published) return [h('span', { class: 'muted', data: { listing: m.sha256 } }, 'not published'), '–'];
  return [
    h('span', { title: `ModelRegistry model #${l.modelId}; deployed flag ${l.deployed ? 'set' : 'not set'}`, data: { listing: m.sha256 } }, `#${l.modelId}`),
    h('span', { title: `${l.price} NIM (${l.priceWei} wei) per 1,000 tokens`, data: { price: l.priceWei } }, `${displayNim(l.price)} NIM`),
  ];
}

/** Deploy (a model not served) or Undeploy (one deploying or serving), for the operator. */
function deployButton(m: DashboardModel, ctx: PageContext): HTMLElement | string {
  if (m.kind !== 'gpt') return '';
  const live = !!m.deployment && m.deployment.status !== 'undeployed';
  const what = live ? 'Undeploy' : 'Deploy';
  const button = h('button', { type: 'button', class: 'small', data: { action: what.toLowerCase(), model: m.name }, disabled: !ctx.operator, title: ctx.operator ? `${what.toLowerCase()} ${m.name}` : `log in as the operator to ${what.toLowerCase()}` }, what);
  button.addEventListener('click', () => {
    button.setAttribute('disabled', '');
    (live ? api.undeploy(m.sha256) : api.deploy(m.sha256, {}))
      .then((d) => ctx.notify(`${d.name}: ${d.status}${d.message ? ` (${d.message})` : ''}`))
      .catch((err: Error) => {
        ctx.notify(err instanceof ApiError ? `refused (${err.status}): ${err.message}` : err.message, true);
        if (ctx.operator) button.removeAttribute('disabled');
      });
  });
  return button;
}

function stagesOf(d: DeploymentView): HTMLElement {
  return h(
    'div',
    { class: 'pipeline small' },
    d.stages.map((s) => h('div', { class: 'stage' }, h('div', { class: 'stage-head' }, `stage ${s.stage} · parts ${s.parts[0]}–${s.parts[1]}`), s.miners.map((m) => h('div', { class: `replica${m.alive ? '' : ' gone'}`, title: m.detail ?? m.id }, m.name ?? short(m.id), ' ', badge(m.state))))),
  );
}
