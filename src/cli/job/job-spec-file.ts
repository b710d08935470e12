// Reading a job spec file for nbcli: unreadable files and invalid specs end
// the command with one line per problem, each naming its field.
import { readFileSync } from 'node:fs';
import { JobSpecError, parseJobSpec, type JobSpec } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';

/** Reads and validates a spec file; every problem is named with its field. */
export function readJobSpec(file: string): JobSpec {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new NimbleError('invalid', `cannot read ${file}: ${(err as Error).message}`);
  }
  try {
    return parseJobSpec(text, file);
  } catch (err) {
    if (err instanceof JobSpecError) throw new NimbleError('invalid', err.message);
    throw err;
  }
}
