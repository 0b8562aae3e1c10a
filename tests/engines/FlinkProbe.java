// Run by tests/engines/test_flink_iceberg.py with Java's source launcher on the classpath
// flight_gateway.local.engines.flink_classpath() resolves: Flink SQL (batch) with Iceberg's Flink
// runtime reads a table of the gateway's Iceberg REST face, latest and at a snapshot, and prints
// {"latest": [[column values], ...], "old": [...]}.
import java.util.ArrayList;
import java.util.List;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.util.CloseableIterator;

public class FlinkProbe {
    public static void main(String[] args) throws Exception {
        String uri = args[0], table = args[1], snapshot = args[2];
        TableEnvironment env = TableEnvironment.create(EnvironmentSettings.inBatchMode());
        env.executeSql("CREATE CATALOG harness WITH ('type' = 'iceberg', 'catalog-type' = 'rest', 'uri' = '" + uri + "')");
        String from = "harness.harness.`" + table + "`";
        String latest = rows(env.executeSql("SELECT * FROM " + from));
        String old = rows(env.executeSql("SELECT * FROM " + from + " /*+ OPTIONS('snapshot-id'='" + snapshot + "') */"));
        System.out.println("{\"latest\": " + latest + ", \"old\": " + old + "}");
    }

    static String rows(TableResult result) throws Exception {
        List<String> out = new ArrayList<>();
        try (CloseableIterator<Row> it = result.collect()) {
            while (it.hasNext()) {
                Row r = it.next();
                List<String> fields = new ArrayList<>();
                for (int i = 0; i < r.getArity(); i++) {
                    Object v = r.getField(i);
                    fields.add(v == null ? "null" : v instanceof Number ? v.toString() : "\"" + v.toString().replace("\\", "\\\\").replace("\"", "\\\"") + "\"");
                }
                out.add("[" + String.join(", ", fields) + "]");
            }
        }
        return "[" + String.join(", ", out) + "]";
    }
}
