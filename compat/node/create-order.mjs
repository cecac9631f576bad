// create-order.mjs makes one call through the openai Node SDK, with the
// SDK's own timeout and retries, and prints what the call ended in as one
// JSON line on standard output:
//
//   {"ok":true,"status":<HTTP status>,"result":<the parsed response body>,"replayed":"<idempotent-replayed>"}
//   {"ok":false,"status":<HTTP status or null>,"name":"<error class>","message":"...",
//    "shouldRetry":"<x-should-retry of the last response>","replayed":"<idempotent-replayed>"}
//
// The SDK keeps only the "error" member of an error body, which a
// problem+json body has not: what the call ended in is read from the
// status and the headers.
//
// The compatibility suite (../sdk_test.go) runs it against the real sidecar.
// Settings come from the environment:
//
//   COMPAT_BASE_URL     the sidecar (or the suite's counting front)
//   COMPAT_PATH         the path to POST to, e.g. /v1/orders
//   COMPAT_TENANT       X-Tenant-ID
//   COMPAT_KEY          Idempotency-Key: the OpenAI and Anthropic clients
//                       send none of their own, so the caller sets it
//   COMPAT_BODY         the JSON body
//   COMPAT_TIMEOUT_MS   the SDK's timeout per attempt
//   COMPAT_MAX_RETRIES  the SDK's maxRetries
import OpenAI from 'openai';

const env = process.env;
const client = new OpenAI({
  apiKey: 'sk-compat-dummy',
  baseURL: env.COMPAT_BASE_URL,
  timeout: Number(env.COMPAT_TIMEOUT_MS),
  maxRetries: Number(env.COMPAT_MAX_RETRIES),
  defaultHeaders: { 'X-Tenant-ID': env.COMPAT_TENANT },
  logLevel: 'info',
  logger: stderrLogger(),
});

function stderrLogger() {
  const log = (level) => (...args) => process.stderr.write(`[openai ${level}] ${args.map(String).join(' ')}\n`);
  return { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') };
}

try {
  const { data: result, response } = await client
    .post(env.COMPAT_PATH, {
      body: JSON.parse(env.COMPAT_BODY),
      headers: { 'Idempotency-Key': env.COMPAT_KEY },
    })
    .withResponse();
  process.stdout.write(JSON.stringify({
    ok: true,
    status: response.status,
    result,
    replayed: response.headers.get('idempotent-replayed'),
  }) + '\n');
} catch (err) {
  process.stdout.write(JSON.stringify({
    ok: false,
    status: err.status ?? null,
    name: err.constructor?.name ?? 'Error',
    message: err.message,
    shouldRetry: err.headers?.get?.('x-should-retry') ?? null,
    replayed: err.headers?.get?.('idempotent-replayed') ?? null,
  }) + '\n');
}
