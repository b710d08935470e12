// The command reference: every nbcli command with its arguments and flags, one
// line each, as the README's "Command reference" shows it. Rendered from the
// program itself (./program.ts), so that `nbcli --help` and the README cannot
// drift apart: test/cli/readme.test.ts compares them, and
// `node --import tsx scripts/cli-reference.ts` rewrites the README's section.
import type { Command, Option } from 'commander';

/** Flags every command takes; the reference names them once, not on each line. */
export const COMMON_FLAGS: readonly string[] = ['--data-dir', '--json'];

/** One leaf command: its words after `nbcli`, its arguments, its flags. */
export interface CommandEntry {
  readonly path: readonly string[];
  readonly args: readonly { readonly name: string; readonly required: boolean }[];
  readonly options: readonly { readonly flag: string; readonly value: string | null; readonly mandatory: boolean; readonly negate: boolean }[];
  readonly description: string;
}

const optionEntry = (o: Option): CommandEntry['options'][number] => {
  const flag = o.long ?? o.short ?? o.flags;
  const value = /[<[]([^>\]]+)[>\]]/.exec(o.flags)?.[1] ?? null;
  return { flag, value, mandatory: o.mandatory, negate: o.negate };
};

/** Every command of `program` that runs (has no subcommands), in help order. */
export function commandEntries(program: Command): CommandEntry[] {
  const out: CommandEntry[] = [];
  const walk = (cmd: Command, path: string[]): void => {
    if (cmd.commands.length === 0) {
      out.push({
        path,
        args: cmd.registeredArguments.map((a) => ({ name: a.name(), required: a.required })),
        options: cmd.options.filter((o) => !o.hidden).map(optionEntry),
        description: cmd.description(),
      });
      return;
    }
    for (const sub of cmd.commands) walk(sub, [...path, sub.name()]);
  };
  for (const cmd of program.commands) walk(cmd, [cmd.name()]);
  return out;
}

const placeholder = (name: string): string => name.replace(/-/g, '_').toUpperCase();

/** `./nbcli job submit FILE [--follow] [--orchestrator URL] …`: one entry as a synopsis line. */
export function synopsis(entry: CommandEntry): string {
  const words = ['./nbcli', ...entry.path];
  for (const a of entry.args) words.push(a.required ? placeholder(a.name) : `[${placeholder(a.name)}]`);
  for (const o of entry.options) {
    if (COMMON_FLAGS.includes(o.flag)) continue;
    const text = o.value === null ? o.flag : `${o.flag} ${placeholder(o.value)}`;
    words.push(o.mandatory ? text : `[${text}]`);
  }
  return words.join(' ');
}

/** The README's reference section (without its markers). */
export function renderReference(program: Command): string {
  const lines = commandEntries(program).map(synopsis);
  return ['```sh', ...lines, '```', ''].join('\n');
}
