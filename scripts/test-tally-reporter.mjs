// A node:test reporter for scripts/run-tests.mjs, beside `spec`: one JSON
// line per test that ended ({ file, nesting, name, failed }), written to its
// --test-reporter-destination. run-tests reads it to find the files that ran
// none of their tests: node's runner reports such a file (a top-level await
// or a before() hook whose promise never settled while the event loop
// emptied, an exit before any test ran) as one test named after the file,
// which passes when the process exited with 0.
export default async function* tally(source) {
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { file, nesting, name } = event.data;
    if (!file) continue;
    yield `${JSON.stringify({ file, nesting, name, failed: event.type === 'test:fail' })}\n`;
  }
}

/**
 * The files of `lines` (the reporter's output) whose only entry is the one
 * node's runner makes for the file itself: a test named after the file, at
 * nesting 0. A skipped test counts as one that ran (it is reported as a pass
 * with `skip`), so a file skipped on purpose is not among them.
 */
export function filesThatRanNone(lines) {
  const ran = new Map();
  for (const line of lines) {
    let event;
    try {
      event = JSON.parse(line);
    } catch {
      continue; // empty, or cut short by a lane that was killed (its exit status fails it)
    }
    const { file, nesting, name, failed } = event;
    const entry = ran.get(file) ?? { tests: 0, failed: false };
    if (nesting === 0 && name === file) entry.failed ||= failed;
    else entry.tests++;
    ran.set(file, entry);
  }
  return [...ran].filter(([, e]) => e.tests === 0).map(([file, e]) => ({ file, failed: e.failed }));
}
