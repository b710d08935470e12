// Run as a program: measures the engine's job times (./calibrate.ts
// measureEngine) in a process of its own, so a bench can take them while a
// local network trains on the same cores (what a miner's thread gets then).
// argv[2]: the LocalNetwork as JSON. Prints the JobTimes as one JSON line.
import { Type } from '@sinclair/typebox';
import { pathToFileURL } from 'node:url';
import { parseJson } from '../protocol/messages.ts';
import { measureEngine } from './calibrate.ts';

const LocalMiner = Type.Object({ name: Type.String(), gflops: Type.Number({ exclusiveMinimum: 0 }), memoryBytes: Type.Number({ minimum: 0 }), bandwidthMbps: Type.Number({ minimum: 0 }), threads: Type.Integer({ minimum: 1 }) });
const LocalNetwork = Type.Object({
  miners: Type.Array(LocalMiner, { minItems: 1 }),
  model: Type.String(),
  stages: Type.Integer({ minimum: 1 }),
  batchSize: Type.Integer({ minimum: 1 }),
  mergeEvery: Type.Integer({ minimum: 1 }),
  codec: Type.Optional(Type.Union([Type.Literal('f32'), Type.Literal('f16'), Type.Literal('int8-row')])),
});

export async function probeMain(argv: string[]): Promise<void> {
  const net = parseJson(LocalNetwork, argv[2] ?? '', 'the local network');
  process.stdout.write(JSON.stringify(await measureEngine(net)) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await probeMain(process.argv);
