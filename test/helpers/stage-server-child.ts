// A serving stage in a process of its own (./stage-server.ts on a
// single-thread engine), for the serving benches: a miner's /infer without
// the rest of the miner. Arguments: one JSON object {checkpoint (a file
// path), from, to, stage, stageCount, orchestratorKey, domain, deploymentId,
// maxSessions, id}. Prints {"event":"listening","url":…} once it serves; runs
// until killed.
import { readFileSync } from 'node:fs';
import { Type } from '@sinclair/typebox';
import { Engine } from '../../src/engine/engine.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { parseJson } from '../../src/protocol/messages.ts';
import { startStageServer } from './stage-server.ts';

const Args = Type.Object({
  checkpoint: Type.String({ minLength: 1 }),
  from: Type.Integer({ minimum: 0 }),
  to: Type.Integer({ minimum: 1 }),
  stage: Type.Integer({ minimum: 0 }),
  stageCount: Type.Integer({ minimum: 1 }),
  orchestratorKey: Type.String({ minLength: 1 }),
  domain: Type.String({ minLength: 1 }),
  deploymentId: Type.String({ minLength: 1 }),
  maxSessions: Type.Integer({ minimum: 1 }),
  id: Type.String({ minLength: 1 }),
});

const args = parseJson(Args, process.argv[2] ?? '', 'stage server arguments');
const engine = await Engine.create({ threads: 1 });
const inference = inferenceFromCheckpoint(engine, readFileSync(args.checkpoint), { from: args.from, to: args.to }, { maxSessions: args.maxSessions });
const s = await startStageServer({ ...args, inference });
process.stdout.write(`${JSON.stringify({ event: 'listening', url: s.peer.url })}\n`);
