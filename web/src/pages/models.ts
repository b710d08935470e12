// The Models page: the models stored to publish (name, sha256, owner, size,
// source job) and their deployments (status, stages, the miners serving each
// stage and what they reported).
import type { DeploymentView } from '../../../src/api/deployments.ts';
import { badge, fill, h, table } from '../dom.ts';
import { ago, bytes, short } from '../format.ts';
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
        ['name', 'sha256', 'model', 'owner', 'size', 'from', 'stored', 'deployment'],
        (list ?? []).map((m) => [
          m.name,
          h('code', { title: m.sha256 }, short(m.sha256, 8)),
          `${m.kind} · ${m.model}`,
          h('code', { title: m.owner }, short(m.owner)),
          bytes(m.bytes),
          m.jobId ? h('a', { href: `#/jobs/${encodeURIComponent(m.jobId)}` }, `${m.jobId} step ${m.step}`) : 'uploaded',
          ago(m.createdAt, now),
          m.deployment ? badge(m.deployment.status) : h('span', { class: 'muted' }, 'not deployed'),
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

function stagesOf(d: DeploymentView): HTMLElement {
  return h(
    'div',
    { class: 'pipeline small' },
    d.stages.map((s) => h('div', { class: 'stage' }, h('div', { class: 'stage-head' }, `stage ${s.stage} · parts ${s.parts[0]}–${s.parts[1]}`), s.miners.map((m) => h('div', { class: `replica${m.alive ? '' : ' gone'}`, title: m.detail ?? m.id }, m.name ?? short(m.id), ' ', badge(m.state))))),
  );
}
