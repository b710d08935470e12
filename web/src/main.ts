// The dashboard (docs/dashboard.md): a small single-page app on the
// orchestrator's HTTP API. It opens the live feed once, routes on the URL's
// hash (#/, #/runs, #/runs/ID, #/jobs/ID, #/rewards, #/models, #/playground, #/wallets) and draws the
// page asked for; whether this browser is the operator comes from
// GET /session (the login cookie itself is HttpOnly: the page never sees it).
// first: the uPlot module reads navigator.language as it loads
import './intl-guard.ts';
import './style.css';
import { api } from './api.ts';
import { fill, h } from './dom.ts';
import { Feed } from './feed.ts';
import { detailPage } from './pages/detail.ts';
import { modelsPage } from './pages/models.ts';
import { networkPage } from './pages/network.ts';
import { playgroundPage } from './pages/playground.ts';
import type { Page, PageContext } from './pages/page.ts';
import { rewardsPage } from './pages/rewards.ts';
import { runsPage } from './pages/runs.ts';
import { walletsPage } from './pages/wallets.ts';

const NAV: readonly [string, string][] = [
  ['#/', 'Network'],
  ['#/runs', 'Runs and jobs'],
  ['#/rewards', 'Rewards'],
  ['#/models', 'Models'],
  ['#/playground', 'Playground'],
  ['#/wallets', 'Wallets'],
];
const ID = /^[A-Za-z0-9_.:-]{1,128}$/;

const app = document.getElementById('app')!;
const nav = document.getElementById('nav')!;
const conn = document.getElementById('conn')!;
const who = document.getElementById('who')!;
const message = h('div', { id: 'message', class: 'message' });
document.body.insertBefore(message, app);

const feed = new Feed((status) => {
  fill(conn, status === 'live' ? '● live' : '○ reconnecting…');
  conn.className = `conn ${status}`;
});
const ctx: PageContext = {
  feed,
  operator: false,
  notify(text, error = false) {
    fill(message, text);
    message.className = text ? `message${error ? ' error' : ' ok'}` : 'message';
  },
};

let current: Page | null = null;

function route(): void {
  current?.dispose();
  fill(message);
  message.className = 'message';
  const hash = location.hash || '#/';
  const [, section = '', rawId] = hash.split('/');
  let id: string | null;
  try {
    id = rawId === undefined ? null : decodeURIComponent(rawId);
  } catch {
    id = null;
  }
  for (const a of nav.querySelectorAll('a')) a.classList.toggle('here', a.getAttribute('href') === `#/${section === 'jobs' ? 'runs' : section}`);
  if ((section === 'runs' || section === 'jobs') && id !== null && ID.test(id)) current = detailPage(app, ctx, section === 'runs' ? 'run' : 'job', id);
  else if (section === 'runs') current = runsPage(app, ctx);
  else if (section === 'rewards') current = rewardsPage(app, ctx);
  else if (section === 'models') current = modelsPage(app, ctx);
  else if (section === 'playground') current = playgroundPage(app, ctx);
  else if (section === 'wallets') current = walletsPage(app, ctx);
  else current = networkPage(app, ctx);
}

async function start(): Promise<void> {
  fill(nav, NAV.map(([href, label]) => h('a', { href }, label)));
  try {
    ctx.operator = (await api.session()).operator;
  } catch {
    ctx.operator = false;
  }
  fill(
    who,
    ctx.operator
      ? [h('span', { class: 'operator', title: 'logged in with the login URL the orchestrator printed' }, 'operator'), ' ', h('button', { type: 'button', on: { click: () => void api.logout().then(() => location.reload()) } }, 'log out')]
      : h('span', { class: 'muted', title: 'open the login URL the orchestrator printed to act' }, 'read-only'),
  );
  feed.connect();
  window.addEventListener('hashchange', route);
  route();
}

void start();
