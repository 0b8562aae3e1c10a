// A JDBC client of the gateway's Flight SQL face through Apache Arrow's Flight SQL JDBC driver,
// run by tests/engines/test_flight_sql_jdbc.py with Java's source launcher. Each argument is one
// step, "kind<TAB>text[<TAB>parameter]"; each step prints one JSON line:
//   query      Statement.executeQuery(text)                -> {"columns": [...], "rows": [[...]]}
//   prepared   PreparedStatement(text), setLong(1, param)  -> the same
//   metadata   the DatabaseMetaData calls DBeaver makes    -> {"catalogs": ..., "tables": ...}
//   fail       a statement expected to fail                -> {"error": SQLException message}
import java.sql.*;
import java.util.*;

public class FlightSqlProbe {
    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0])) {
            for (int i = 1; i < args.length; i++) {
                String[] step = args[i].split("\t");
                System.out.println(run(conn, step));
            }
        }
    }

    static String run(Connection conn, String[] step) throws SQLException {
        switch (step[0]) {
            case "query":
                try (Statement s = conn.createStatement(); ResultSet rs = s.executeQuery(step[1])) {
                    return result(rs);
                }
            case "prepared":
                try (PreparedStatement p = conn.prepareStatement(step[1])) {
                    p.setLong(1, Long.parseLong(step[2]));
                    try (ResultSet rs = p.executeQuery()) {
                        return result(rs);
                    }
                }
            case "metadata":
                return metadata(conn.getMetaData(), step[1]);
            case "fail":
                try (Statement s = conn.createStatement(); ResultSet rs = s.executeQuery(step[1])) {
                    while (rs.next()) { }
                    return "{\"error\": null}";
                } catch (SQLException e) {
                    return "{\"error\": " + quote(String.valueOf(e.getMessage())) + "}";
                }
            default:
                throw new IllegalArgumentException("unknown step " + step[0]);
        }
    }

    static String metadata(DatabaseMetaData md, String table) throws SQLException {
        StringBuilder out = new StringBuilder("{");
        out.append("\"product\": ").append(quote(md.getDatabaseProductName())).append(", ");
        out.append("\"version\": ").append(quote(md.getDatabaseProductVersion())).append(", ");
        out.append("\"identifier_quote\": ").append(quote(md.getIdentifierQuoteString())).append(", ");
        out.append("\"catalogs\": ").append(column(md.getCatalogs(), "TABLE_CAT")).append(", ");
        out.append("\"schemas\": ").append(column(md.getSchemas(), "TABLE_SCHEM")).append(", ");
        out.append("\"table_types\": ").append(column(md.getTableTypes(), "TABLE_TYPE")).append(", ");
        out.append("\"tables\": ").append(column(md.getTables(null, null, "%", null), "TABLE_NAME")).append(", ");
        out.append("\"columns\": ").append(column(md.getColumns(null, null, table, "%"), "COLUMN_NAME")).append(", ");
        out.append("\"column_types\": ").append(column(md.getColumns(null, null, table, "%"), "TYPE_NAME"));
        return out.append("}").toString();
    }

    static String column(ResultSet rs, String name) throws SQLException {
        List<String> values = new ArrayList<>();
        try (rs) {
            while (rs.next()) {
                values.add(quote(String.valueOf(rs.getObject(name))));
            }
        }
        return "[" + String.join(", ", values) + "]";
    }

    static String result(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        List<String> columns = new ArrayList<>();
        for (int c = 1; c <= md.getColumnCount(); c++) {
            columns.add(quote(md.getColumnLabel(c)));
        }
        List<String> rows = new ArrayList<>();
        while (rs.next()) {
            List<String> row = new ArrayList<>();
            for (int c = 1; c <= md.getColumnCount(); c++) {
                Object v = rs.getObject(c);
                row.add(v == null ? "null" : v instanceof Number ? v.toString() : quote(v.toString()));
            }
            rows.add("[" + String.join(", ", row) + "]");
        }
        return "{\"columns\": [" + String.join(", ", columns) + "], \"rows\": [" + String.join(", ", rows) + "]}";
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (ch < 0x20) {
                        b.append(String.format("\\u%04x", (int) ch));
                    } else {
                        b.append(ch);
                    }
            }
        }
        return b.append('"').toString();
    }
}
