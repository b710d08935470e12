// One miner of a Byzantine kind (./byzantine.ts) in a process of its own:
//   node --import tsx test/helpers/byzantine-miner.ts ORCHESTRATOR DATA_DIR NAME KIND
// It signs with <DATA_DIR>/miner-key.json (made there if missing), prints
// {"event":"started","address":…,"url":…} on stdout once joined, and stops on
// SIGTERM.
import { Miner } from '../../src/miner/miner.ts';
import { isKind, tamperOf } from './byzantine.ts';

const [orchestrator, dataDir, name, kind] = process.argv.slice(2);
if (!orchestrator || !dataDir || !name || !kind || !isKind(kind)) {
  process.stderr.write('usage: byzantine-miner.ts ORCHESTRATOR DATA_DIR NAME honest|inflate|blame|poison|lazy\n');
  process.exit(2);
}
const miner = await Miner.start({ orchestrator, dataDir, name, threads: 1, tamper: tamperOf(kind), log: (line) => process.stderr.write(`${name}: ${line}\n`) });
process.stdout.write(JSON.stringify({ event: 'started', address: miner.address, url: miner.url, kind }) + '\n');
const stop = (): void => void miner.stop().then(() => process.exit(0));
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
