"""A test harness that uses the rest of the recording endpoint: the model list, the Responses API and a
streamed Chat Completions call; it prints the streamed answer."""

import json
import os
import urllib.request

BASE, KEY, MODEL = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["OPENAI_MODEL"]


def call(path: str, body: dict | None = None) -> bytes:
    request = urllib.request.Request(
        BASE + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.read()


assert [m["id"] for m in json.loads(call("/models"))["data"]] == [MODEL]
prompt = os.environ["GYMBUS_PROMPT"]
first = json.loads(call("/responses", {"model": MODEL, "input": prompt, "instructions": "Be brief."}))
said = [i for i in first["output"] if i["type"] == "message"]
messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": said[-1]["content"][0]["text"]}]
messages.append({"role": "user", "content": "Say it once more."})
stream = call("/chat/completions", {"model": MODEL, "messages": messages, "stream": True}).decode()
chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
assert stream.rstrip().endswith("data: [DONE]")
print(chunks[0]["choices"][0]["delta"]["content"])
