// A math agent in Node.js, trained by `ajet serve` through the episode API (docs/episode_api.md).
//
//   npm install --prefix tutorial/example_remote_agent
//   AJET_URL=http://127.0.0.1:8765 AJET_TOKEN=secret node tutorial/example_remote_agent/agent.mjs
//
// Loop: ask for an episode (its task, a base URL and a per-episode key), solve the task with the
// official `openai` package pointed at that base URL (every call is recorded token by token for
// training), then finish the episode with the final answer: the server's math judge scores it.
// Optional: AJET_MAX_EPISODES (stop after that many), AJET_LOG (append one JSON line per reply).
import { appendFileSync } from "node:fs";
import OpenAI from "openai";

const url = (process.env.AJET_URL ?? "http://127.0.0.1:8765").replace(/\/+$/, "").replace(/\/v1$/, "");
const token = process.env.AJET_TOKEN;
const maxEpisodes = Number(process.env.AJET_MAX_EPISODES ?? Infinity);
const log = process.env.AJET_LOG;
const SYSTEM_PROMPT =
  "You solve arithmetic word problems. Give the final answer as a number in \\boxed{}, e.g. \\boxed{42}.";

if (!token) {
  console.error("set AJET_TOKEN to the server's client token (printed by `ajet serve`, also in RUN/serve.json)");
  process.exit(2);
}

// `episodeKey`: finish and abort show the episode's own api_key (only its client may end it).
async function api(path, body, episodeKey = "") {
  const response = await fetch(`${url}/v1${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", "X-Episode-Key": episodeKey },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, json: await response.json() };
}

// The next episode, or null once the run has ended (410). 503: the trainer has enough episodes
// in flight for now; wait as the server says and ask again.
async function beginEpisode() {
  for (;;) {
    const { status, headers, json } = await api("/episodes", {});
    if (status === 200) return json;
    if (status === 410) return null;
    if (status !== 503) throw new Error(`POST /v1/episodes: ${status} ${JSON.stringify(json)}`);
    const seconds = Number(headers.get("retry-after") ?? "1");
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }
}

async function solve(episode) {
  // maxRetries 0: a retried request whose first attempt already ran would be recorded twice.
  const client = new OpenAI({ baseURL: episode.base_url, apiKey: episode.api_key, maxRetries: 0 });
  const reply = await client.chat.completions.create({
    model: episode.model,
    messages: [
      { role: "system", content: SYSTEM_PROMPT },
      { role: "user", content: episode.task.main_query },
    ],
  });
  return reply.choices[0].message.content ?? "";
}

let done = 0;
while (done < maxEpisodes) {
  const episode = await beginEpisode();
  if (episode === null) break;
  let answer;
  try {
    answer = await solve(episode);
  } catch (err) {
    // Counted as failed by the trainer, never trained on.
    await api(`/episodes/${episode.episode_id}/abort`, { reason: String(err).slice(0, 500) }, episode.api_key);
    continue;
  }
  if (log) appendFileSync(log, JSON.stringify({ episode_id: episode.episode_id, content: answer }) + "\n");
  const result = await api(`/episodes/${episode.episode_id}/finish`, { metadata: { final_answer: answer } },
                           episode.api_key);
  if (result.status !== 200) throw new Error(`finish: ${result.status} ${JSON.stringify(result.json)}`);
  done += 1;
}
console.log(`node agent: ${done} episodes finished`);
