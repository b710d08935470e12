// The Wallets page (read-only): the wallets of the orchestrator's data dir
// (`nbcli wallet` keeps them there), each with its free, staked and unstaking
// NIM and the rewards it earned, read from the chain when the page opens or
// is refreshed. Names, addresses and amounts only: no key is ever read.
import type { WalletsView } from '../../../src/api/dashboard.ts';
import { api } from '../api.ts';
import { fill, h, table } from '../dom.ts';
import { displayNim } from '../format.ts';
import type { Page, PageContext } from './page.ts';

const nim = (exact: string): HTMLSpanElement => h('span', { title: `${exact} NIM` }, displayNim(exact));

export function walletsPage(root: HTMLElement, ctx: PageContext): Page {
  const summary = h('p', { class: 'summary', id: 'wallets-summary' }, 'reading the chain…');
  const list = h('div', { id: 'wallets' });
  let live = true;
  const load = (): void => {
    api
      .wallets()
      .then((v) => live && draw(v))
      .catch((err: Error) => live && ctx.notify(`wallets: ${err.message}`, true));
  };
  const draw = (v: WalletsView): void => {
    fill(summary, v.dir === null ? 'this orchestrator was started without a data dir of wallets' : `${v.wallets.length} wallet${v.wallets.length === 1 ? '' : 's'} in ${v.dir}${v.chainId === null ? ' · the network is unpaid: no balances' : ` · balances on chain ${v.chainId}`}`);
    fill(
      list,
      table(
        ['name', 'address', 'free NIM', 'staked', 'unstaking', 'rewards earned'],
        v.wallets.map((w) => [
          h('span', { data: { wallet: w.name } }, w.name),
          h('code', null, w.address),
          ...(w.balance ? [nim(w.balance.free), nim(w.balance.staked), nim(w.balance.unstaking), nim(w.balance.rewardsTotal)] : [w.error ?? '–', '–', '–', '–']),
        ]),
        { class: 'grid' },
      ),
    );
  };
  fill(root, h('h1', null, 'Wallets'), summary, h('div', { class: 'actions' }, h('button', { type: 'button', id: 'wallets-refresh', on: { click: load } }, 'Refresh')), list);
  load();
  return {
    dispose: () => {
      live = false;
    },
  };
}
