plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

// An ExecuTorch install for the phone (README): its lib/cmake holds the config CMake finds.
val executorchDir = file(providers.gradleProperty("executorchDir").get()).absolutePath

android {
    namespace = "org.hyflash.demo"
    compileSdk = 34
    ndkVersion = "27.2.12479018"

    defaultConfig {
        applicationId = "org.hyflash.demo"
        minSdk = 26
        targetSdk = 34
        versionCode = 1
        versionName = "0.1"
        ndk { abiFilters += "arm64-v8a" }
        externalNativeBuild {
            cmake {
                arguments += "-DCMAKE_PREFIX_PATH=$executorchDir"
                cppFlags += "-std=c++17"
            }
        }
    }
    buildTypes {
        release {
            isMinifyEnabled = false
            signingConfig = signingConfigs.getByName("debug")
        }
    }
    externalNativeBuild {
        cmake {
            path = file("src/main/cpp/CMakeLists.txt")
            version = "3.31.6"
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions { jvmTarget = "17" }
}
