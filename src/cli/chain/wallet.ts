// nbcli wallet create|import|list|balance|transfer|faucet
import { displayNim } from '../../chain/nim-display.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { Command } from 'commander';
import type { Address } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { formatNim, showNim, parseNim } from '../../chain/amounts.ts';
import { faucet, nimBalance, transferNim } from '../../chain/token.ts';
import { checkWalletName, listWallets, loadWalletFile, privateKeyFromSecret, saveWallet } from '../../chain/wallets.ts';
import { readBalanceView, type BalanceView } from '../../chain/balance-view.ts';
import { chainRpcOf, onChain, parseAddress, unlock, withChainOption, withOrchestratorChain, withWalletName, type ChainCommandOptions } from '../chain-options.ts';
import { emit, resolveDataDir, withCommonOptions } from '../common.ts';
import { readPassword, readSecret } from '../prompt.ts';

interface WalletOptions extends ChainCommandOptions {
  to?: string;
  amount?: string;
  address?: string;
  index?: string;
  lightKdf?: boolean;
}

const LIGHT_KDF_HELP = "geth's --lightkdf cost (scrypt n=2^12, p=6): the wallet opens in a fraction of the time, and its password is at least 5 times cheaper to guess; for throwaway wallets on a local chain";

export function registerWallet(program: Command): void {
  const wallet = program.command('wallet').description('NIM wallets: create, import, balances, transfers, local faucet');

  withWalletName(withCommonOptions(wallet.command('create')))
    .description('create a wallet (keystore v3 file, password from the prompt or $NIMBLE_PASSWORD)')
    .option('--light-kdf', LIGHT_KDF_HELP)
    .action(async (opts: WalletOptions) => {
      const dataDir = resolveDataDir(opts);
      const name = checkWalletName(opts['wallet.name']);
      assertNewWallet(dataDir, name);
      const password = await readPassword(`Password for the new wallet '${name}': `, { confirm: true });
      const info = saveWallet(dataDir, name, generatePrivateKey(), password, opts.lightKdf ? 'light' : 'standard');
      emit(opts, { name: info.name, address: info.address, file: info.file }, () =>
        [`created wallet ${info.name}: ${info.address}`, `  ${info.file}`, '  keep the password safe: without it the wallet cannot be opened'].join('\n'),
      );
    });

  withWalletName(withCommonOptions(wallet.command('import')))
    .description('import a private key or BIP-39 mnemonic (typed, piped, or $NIMBLE_WALLET_SECRET) as a new wallet')
    .option('--index <n>', 'account index for a mnemonic (m/44\'/60\'/0\'/0/n)', '0')
    .option('--light-kdf', LIGHT_KDF_HELP)
    .action(async (opts: WalletOptions) => {
      const dataDir = resolveDataDir(opts);
      const name = checkWalletName(opts['wallet.name']);
      assertNewWallet(dataDir, name);
      const index = Number(opts.index ?? '0');
      if (!Number.isInteger(index) || index < 0) throw new NimbleError('invalid', `--index must be a whole number, got '${opts.index}'`);
      const key = privateKeyFromSecret(await readSecret('Private key or mnemonic: '), index);
      const password = await readPassword(`Password for the new wallet '${name}': `, { confirm: true });
      const info = saveWallet(dataDir, name, key, password, opts.lightKdf ? 'light' : 'standard');
      emit(opts, { name: info.name, address: info.address, file: info.file }, () => `imported wallet ${info.name}: ${info.address}\n  ${info.file}`);
    });

  withCommonOptions(wallet.command('list'))
    .description('the wallets in the data dir')
    .action((opts: WalletOptions) => {
      const wallets = listWallets(resolveDataDir(opts));
      emit(opts, wallets.map((w) => ({ name: w.name, address: w.address, file: w.file })), () =>
        wallets.length === 0
          ? 'no wallets yet: nbcli wallet create --wallet.name NAME'
          : wallets.map((w) => `${w.name.padEnd(Math.max(...wallets.map((x) => x.name.length)))}  ${w.address}`).join('\n'),
      );
    });

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(wallet.command('balance')))))
    .description('free NIM, staked, unstaking, and rewards earned per epoch')
    .option('--address <address>', 'show any address instead of a wallet')
    .action(async (opts: WalletOptions) => {
      const dataDir = resolveDataDir(opts);
      let name: string | undefined;
      let address: Address;
      if (opts.address) address = parseAddress(opts.address, '--address');
      else {
        const { info } = loadWalletFile(dataDir, checkWalletName(opts['wallet.name']));
        name = info.name;
        address = info.address;
      }
      const view = await onChain(opts, (client) => readBalanceView(client, address), { orchestrator: opts.orchestrator });
      emit(opts, { name: name ?? null, ...view }, () => humanBalance(name, view));
    });

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(wallet.command('transfer')))))
    .description('send free NIM to an address')
    .option('--to <address>', 'recipient address')
    .option('--amount <nim>', 'how many NIM, e.g. 2.5')
    .action(async (opts: WalletOptions) => {
      const to = parseAddress(opts.to, '--to');
      const amount = parseNim(opts.amount);
      const { info, sign } = await unlock(opts);
      const result = await onChain(opts, async (client) => {
        const tx = await transferNim(client, sign(client), to, amount);
        return { tx, free: await nimBalance(client, info.address) };
      }, { orchestrator: opts.orchestrator });
      emit(
        opts,
        { from: info.address, to, amount: formatNim(amount), tx: result.tx.hash, free: formatNim(result.free) },
        () => `sent ${showNim(amount)} NIM from ${info.name} (${info.address}) to ${to}\n  tx ${result.tx.hash}\n  ${showNim(result.free)} NIM left free`,
      );
    });

  withOrchestratorChain(withChainOption(withWalletName(withCommonOptions(wallet.command('faucet')))))
    .description("mint test NIM to a wallet (local chain only: the data dir's, or with --orchestrator that orchestrator's local node)")
    .option('--amount <nim>', 'how many NIM', '1000')
    .action(async (opts: WalletOptions) => {
      if (chainRpcOf(opts) && !opts.orchestrator) {
        throw new NimbleError('invalid', 'the faucet only exists on the local chain nbcli runs itself; it is refused with --chain-rpc');
      }
      const amount = parseNim(opts.amount);
      const { info } = loadWalletFile(resolveDataDir(opts), checkWalletName(opts['wallet.name']));
      const result = await onChain(opts, async (client) => {
        const tx = await faucet(client, info.address, amount);
        return { tx, free: await nimBalance(client, info.address) };
      }, { orchestrator: opts.orchestrator });
      emit(opts, { name: info.name, address: info.address, amount: formatNim(amount), tx: result.tx.hash, free: formatNim(result.free) }, () =>
        `faucet: ${showNim(amount)} NIM to ${info.name} (${info.address}); ${showNim(result.free)} NIM free`,
      );
    });
}

function assertNewWallet(dataDir: string, name: string): void {
  try {
    loadWalletFile(dataDir, name);
  } catch {
    return;
  }
  throw new NimbleError('invalid', `wallet '${name}' already exists`);
}

function humanBalance(name: string | undefined, v: BalanceView): string {
  const lines = [
    `${name ? `wallet ${name} ` : ''}${v.address} (chain ${v.chainId})`,
    `  free       ${displayNim(v.free)} NIM`,
    `  staked     ${displayNim(v.staked)} NIM`,
    `  unstaking  ${displayNim(v.unstaking)} NIM${v.unstakingReleaseAt ? ` (withdrawable from ${v.unstakingReleaseAt})` : ''}`,
    `  rewards    ${displayNim(v.rewardsTotal)} NIM over ${v.rewards.length} epoch${v.rewards.length === 1 ? '' : 's'}`,
    ...v.rewards.map((r) => `    epoch ${r.epoch.padEnd(8)} ${displayNim(r.amount)} NIM`),
    `  gas        ${v.gas} ETH`,
  ];
  return lines.join('\n');
}
