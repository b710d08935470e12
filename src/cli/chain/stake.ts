// nbcli stake add|remove|withdraw
import { NimbleError } from '../../protocol/errors.ts';
import type { Command } from 'commander';
import { formatNim, showNim, parseNim } from '../../chain/amounts.ts';
import { nimBalance } from '../../chain/token.ts';
import { addStake, readStake, removeStake, withdrawIfReady } from '../../chain/staking.ts';
import { onChain, unlock, withChainOption, withOrchestratorChain, withWalletName, type ChainCommandOptions } from '../chain-options.ts';
import { emit, withCommonOptions } from '../common.ts';

interface StakeOptions extends ChainCommandOptions {
  amount?: string;
}

export function registerStake(program: Command): void {
  const stake = program.command('stake').description('stake NIM to mine; take it out again');

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(stake.command('add')))))
    .description('stake free NIM from a wallet')
    .option('--amount <nim>', 'how many NIM')
    .action(async (opts: StakeOptions) => {
      const amount = parseNim(opts.amount);
      const { info, sign } = await unlock(opts);
      const out = await onChain(opts, async (client) => {
        const txs = await addStake(client, sign(client), amount);
        return { txs, position: await readStake(client, info.address), free: await nimBalance(client, info.address) };
      }, { orchestrator: opts.orchestrator });
      emit(
        opts,
        {
          address: info.address,
          staked: formatNim(out.position.staked),
          added: formatNim(amount),
          free: formatNim(out.free),
          txs: out.txs.map((t) => t.hash),
        },
        () => `staked ${showNim(amount)} NIM from ${info.name}: ${showNim(out.position.staked)} NIM staked, ${showNim(out.free)} NIM free`,
      );
    });

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(stake.command('remove')))))
    .description('unstake (all of it without --amount) and withdraw once the cooldown is over')
    .option('--amount <nim>', 'how many NIM (default: the whole stake)')
    .action(async (opts: StakeOptions) => {
      const amount = opts.amount === undefined ? undefined : parseNim(opts.amount);
      const { info, sign } = await unlock(opts);
      const out = await onChain(opts, async (client) => {
        const r = await removeStake(client, sign(client), amount);
        return { ...r, free: await nimBalance(client, info.address) };
      }, { orchestrator: opts.orchestrator });
      const pending = out.position.unstaking > 0n ? new Date(out.position.releaseAt * 1000).toISOString() : null;
      emit(
        opts,
        {
          address: info.address,
          unstaked: formatNim(out.unstaked),
          withdrawn: formatNim(out.withdrawn),
          staked: formatNim(out.position.staked),
          unstaking: formatNim(out.position.unstaking),
          unstakingReleaseAt: pending,
          free: formatNim(out.free),
          txs: out.txs.map((t) => t.hash),
        },
        () =>
          [
            `unstaked ${showNim(out.unstaked)} NIM from ${info.name}; ${showNim(out.position.staked)} NIM still staked`,
            out.withdrawn > 0n ? `  ${showNim(out.withdrawn)} NIM back in the wallet: ${showNim(out.free)} NIM free` : '',
            pending ? `  ${showNim(out.position.unstaking)} NIM unstaking until ${pending}: then run nbcli stake withdraw` : '',
          ]
            .filter(Boolean)
            .join('\n'),
      );
    });

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(stake.command('withdraw')))))
    .description('move unstaked NIM back to the wallet after the cooldown')
    .action(async (opts: StakeOptions) => {
      const { info, sign } = await unlock(opts);
      const out = await onChain(opts, async (client) => {
        const before = await readStake(client, info.address);
        if (before.unstaking === 0n) throw new NimbleError('invalid', `nothing is unstaking in ${info.address}`);
        const r = await withdrawIfReady(client, sign(client));
        return { ...r, before, free: await nimBalance(client, info.address) };
      }, { orchestrator: opts.orchestrator });
      if (out.withdrawn === 0n) {
        throw new NimbleError('invalid', `${showNim(out.before.unstaking)} NIM is unstaking until ${new Date(out.before.releaseAt * 1000).toISOString()}: not yet`);
      }
      emit(opts, { address: info.address, withdrawn: formatNim(out.withdrawn), free: formatNim(out.free), tx: out.tx?.hash ?? null }, () =>
        `withdrew ${showNim(out.withdrawn)} NIM to ${info.name}: ${showNim(out.free)} NIM free`,
      );
    });
}
