// The nbcli program: its top-level commands, each registered by its own
// module under src/cli/, loaded only when the command line can reach it.
import { Command } from 'commander';

type Register = (program: Command) => void;

/**
 * Every top-level command and the module that registers it, in the order
 * `nbcli --help` lists them. A module is imported only when its command runs:
 * `nbcli miner start` loads the miner's code and not the simulator's or the
 * orchestrator's (`nbcli wallet --help` took 0.65 s of CPU instead of 1.2 s on
 * this machine). `nbcli --help`, an unknown command and `nbcli help X` load
 * them all.
 */
const COMMANDS: readonly (readonly [name: string, load: () => Promise<Register>])[] = [
  ['train', async () => (await import('./run/train.ts')).registerTrain],
  ['wallet', async () => (await import('./chain/wallet.ts')).registerWallet],
  ['stake', async () => (await import('./chain/stake.ts')).registerStake],
  ['orchestrator', async () => (await import('./node/orchestrator.ts')).registerOrchestrator],
  ['miner', async () => (await import('./node/miner.ts')).registerMiner],
  ['up', async () => (await import('./up/up.ts')).registerUp],
  ['rewards', async () => (await import('./chain/rewards.ts')).registerRewards],
  ['chain', async () => (await import('./chain/chain.ts')).registerChain],
  ['run', async () => (await import('./run/run.ts')).registerRun],
  ['job', async () => (await import('./job/job.ts')).registerJob],
  ['checkpoint', async () => (await import('./job/checkpoint.ts')).registerCheckpoint],
  ['model', async () => (await import('./model/model.ts')).registerModel],
  ['dataset', async () => (await import('./job/dataset.ts')).registerDataset],
  ['generate', async () => (await import('./inference/generate.ts')).registerGenerate],
  ['api-key', async () => (await import('./inference/api-key.ts')).registerApiKey],
  ['credit', async () => (await import('./inference/credit.ts')).registerCredit],
  ['simulate', async () => (await import('./sim/simulate.ts')).registerSimulate],
];

/** The command names nbcli has, in the order of its help. */
export const COMMAND_NAMES: readonly string[] = COMMANDS.map(([name]) => name);

/**
 * The program with the commands `argv` can reach: only the command named by
 * its first operand when it is one of nbcli's, every command otherwise (the
 * top-level help, `help X`, an unknown command and its suggestions).
 */
export async function buildProgram(argv: readonly string[] = []): Promise<Command> {
  const program = new Command('nbcli')
    .description('Nimble Network: train and serve AI models on machines nobody owns together')
    .version('0.1.0')
    .showHelpAfterError()
    .exitOverride();
  // nbcli's own options (-h, -V) take no value, so the first word that is not an option names the command
  const first = argv.slice(2).find((a) => !a.startsWith('-'));
  const named = COMMANDS.filter(([name]) => name === first);
  const loaders = await Promise.all((named.length === 1 ? named : COMMANDS).map(([, load]) => load()));
  for (const register of loaders) register(program);
  return program;
}
