// Request validation for the shared HTTP server (./server.ts): TypeBox's
// compiled checks on params, querystring and body. One difference from
// @fastify/type-provider-typebox's compiler: a URL part becomes a number only
// when it is written as one in plain decimal ("12", "0.5"), never through
// TypeBox's lenient conversion, which reads "1e30" or "1.9" as the integer 1;
// so `/stages/1e30` is a 400, not stage 1. Bodies are never converted.
import { TypeGuard, type TSchema } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import type { FastifySchemaCompiler } from 'fastify';

/** A number written in plain decimal: no exponent, no sign but minus, no leading zeros, no spaces. */
const DECIMAL = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?$/;

/** The properties of a params or querystring object that the schema wants as numbers, converted when written in plain decimal. */
export function convertUrlPart(schema: TSchema, value: unknown): unknown {
  if (!TypeGuard.IsObject(schema) || typeof value !== 'object' || value === null) return value;
  const out: Record<string, unknown> = { ...(value as Record<string, unknown>) };
  for (const [key, prop] of Object.entries(schema.properties)) {
    const v = out[key];
    if (typeof v === 'string' && (TypeGuard.IsInteger(prop) || TypeGuard.IsNumber(prop)) && DECIMAL.test(v)) out[key] = Number(v);
  }
  return out;
}

/** The validator compiler of every route: the value converted (URL parts only), checked, or the schema errors fastify reports as a 400. */
export const strictValidatorCompiler: FastifySchemaCompiler<TSchema> = ({ schema, httpPart }) => {
  const check = TypeCompiler.Compile(schema);
  return (value: unknown) => {
    const converted = httpPart === 'body' ? value : convertUrlPart(schema, value);
    if (check.Check(converted)) return { value: converted };
    return { error: [...check.Errors(converted)].map((e) => ({ keyword: 'type', params: {}, schemaPath: e.path, instancePath: e.path, message: e.message })) };
  };
};
