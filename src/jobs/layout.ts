// The group a job trains on: pipeline stages × replicas of each. A job starts
// on one miner (1 × 1); an upgrade moves it onto a larger group.
import { Type, type Static } from '@sinclair/typebox';

export const JobLayout = Type.Object(
  {
    stages: Type.Integer({ minimum: 1, maximum: 1024 }),
    replicas: Type.Integer({ minimum: 1, maximum: 1024 }),
  },
  { additionalProperties: false },
);
export type JobLayout = Static<typeof JobLayout>;

/** "2 stages × 2 replicas" */
export function layoutWords(layout: JobLayout): string {
  return `${layout.stages} stage${layout.stages > 1 ? 's' : ''} × ${layout.replicas} replica${layout.replicas > 1 ? 's' : ''}`;
}

/** An upgrade without a layout: 2 stages (1 for a one-part model), and as many replicas of each, up to 4, as the alive miners allow. */
export function defaultUpgrade(parts: number, aliveMiners: number): JobLayout {
  const stages = Math.min(2, parts);
  return { stages, replicas: Math.max(1, Math.min(4, Math.floor(aliveMiners / stages))) };
}
