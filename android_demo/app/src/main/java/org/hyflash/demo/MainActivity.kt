package org.hyflash.demo

import android.app.Activity
import android.os.Bundle
import android.widget.Button
import android.widget.CheckBox
import android.widget.EditText
import android.widget.TextView
import org.json.JSONObject
import java.io.File
import java.util.concurrent.Executors

/**
 * One screen: a bundle folder (pushed with adb, see README), a prompt, Generate. The
 * completion appears with tau (tokens per target verify), acceptance by draft position and
 * tokens/s. All work happens in the C++ runtime on one background thread.
 */
class MainActivity : Activity() {
    private val worker = Executors.newSingleThreadExecutor()
    private var opened: String? = null
    private var engine = 0L
    private var tokenizer: Tokenizer? = null

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        val bundle = findViewById<EditText>(R.id.bundle)
        val prompt = findViewById<EditText>(R.id.prompt)
        val draft = findViewById<CheckBox>(R.id.draft)
        val button = findViewById<Button>(R.id.generate)
        val output = findViewById<TextView>(R.id.output)
        val stats = findViewById<TextView>(R.id.stats)
        button.setOnClickListener {
            button.isEnabled = false
            stats.text = getString(R.string.running)
            val folder = bundle.text.toString().trim()
            val text = prompt.text.toString()
            val speculative = draft.isChecked
            worker.execute {
                val shown = try {
                    Result.success(generate(folder, text, speculative))
                } catch (e: IllegalArgumentException) {
                    Result.failure(e)
                }
                runOnUiThread {
                    shown.onSuccess { (completion, summary) ->
                        output.text = text + completion
                        stats.text = summary
                    }.onFailure { stats.text = getString(R.string.error, it.message) }
                    button.isEnabled = true
                }
            }
        }
    }

    /** Runs on the worker thread: (completion text, stats line). */
    private fun generate(folder: String, text: String, draft: Boolean): Pair<String, String> {
        if (opened != folder) {
            closeEngine()
            engine = NativeEngine.open(folder, THREADS)
            tokenizer = Tokenizer(File(folder, "tokenizer.json").path)
            opened = folder
        }
        val ids = tokenizer!!.encode(text)
        val result = JSONObject(NativeEngine.generate(engine, ids, MAX_NEW_TOKENS, draft))
        val tokens = result.getJSONArray("tokens")
        val completion = tokenizer!!.decode(IntArray(tokens.length()) { tokens.getInt(it) })
        val s = result.getJSONObject("stats")
        val rates = s.getJSONArray("acceptance_rates")
        val byPosition = (0 until rates.length()).joinToString(" ") {
            if (rates.isNull(it)) "-" else "%.2f".format(rates.getDouble(it))
        }
        val tau = if (s.isNull("tau")) "-" else "%.2f".format(s.getDouble("tau"))
        val summary = getString(
            R.string.summary, s.getInt("new_tokens"), s.optDouble("tokens_per_s", Double.NaN), tau,
            byPosition.ifEmpty { "-" }, s.getString("stop_reason"),
        )
        return completion to summary
    }

    private fun closeEngine() {
        if (engine != 0L) NativeEngine.close(engine)
        tokenizer?.close()
        engine = 0L
        tokenizer = null
        opened = null
    }

    override fun onDestroy() {
        worker.execute { closeEngine() }
        worker.shutdown()
        super.onDestroy()
    }

    private companion object {
        const val THREADS = 2
        const val MAX_NEW_TOKENS = 128
    }
}
